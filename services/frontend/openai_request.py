"""OpenAI request bodies → typed requests, or a `RequestError` naming the offending field.

Only what the gateway itself decides is checked here (sampling, lengths, stop, logit_bias, model,
prompt shape). Messages and tools are validated by `chat_format` and `constraints`, which know their
rules. Error messages never quote more than a few dozen characters of the client's input.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Optional, Union

from services.frontend.errors import RequestError

MAX_STOP_STRINGS = 4
GREEDY_ONLY = "only greedy decoding is supported"


class UnknownModelError(RequestError):
    """The request names a model this deployment does not serve → HTTP 404."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model {_brief(model)} does not exist; this server serves one model.",
                         "model", "model_not_found")


@dataclass(frozen=True)
class RequestLimits:
    """What validation needs to know about the deployment."""

    served_model_name: str
    vocab_size: int
    default_temperature: float


@dataclass(frozen=True)
class GenerationParams:
    """The request fields that steer generation, shared by chat and text completions."""

    stream: bool
    include_usage: bool
    max_tokens: Optional[int]   # None: the generate-config default applies
    stop: tuple[str, ...]
    logit_bias: tuple[tuple[int, float], ...]
    ignore_eos: bool


@dataclass(frozen=True)
class ChatRequest:
    body: dict[str, Any]        # the raw body, for prompt rendering and constraint building
    tools: list[dict[str, Any]]
    params: GenerationParams


@dataclass(frozen=True)
class CompletionRequest:
    prompt: Union[str, list[int]]
    params: GenerationParams


@dataclass(frozen=True)
class TokenizeRequest:
    """Exactly one of `prompt` and `chat_body` is set."""

    prompt: Optional[str]
    chat_body: Optional[dict[str, Any]]
    add_special_tokens: bool


def decode_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(f"The request body is not valid JSON: {_brief(str(error), 120)}") from None
    if not isinstance(body, dict):
        raise RequestError(f"The request body must be a JSON object, not {_json_type(body)}.")
    return body


def parse_chat_request(body: dict[str, Any], limits: RequestLimits) -> ChatRequest:
    check_model(body, limits)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list of messages.", "messages")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        raise RequestError("logprobs are not supported by this server.", "logprobs")
    tools = _tools(body)
    _check_tool_choice(body.get("tool_choice"), tools)
    _check_response_format(body.get("response_format"))
    max_tokens = _max_tokens(body)
    return ChatRequest(body, tools, _generation_params(body, limits, max_tokens))


def parse_completion_request(body: dict[str, Any], limits: RequestLimits) -> CompletionRequest:
    check_model(body, limits)
    prompt = _completion_prompt(body.get("prompt"), limits.vocab_size)
    if body.get("logprobs") is not None:
        raise RequestError("logprobs are not supported by this server.", "logprobs")
    if body.get("echo"):
        raise RequestError("`echo` is not supported by this server.", "echo")
    if body.get("suffix") is not None:
        raise RequestError("`suffix` is not supported by this server.", "suffix")
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise RequestError(f"`best_of` must be 1: {GREEDY_ONLY}.", "best_of")
    max_tokens = _optional_int(body, "max_tokens", minimum=1)
    return CompletionRequest(prompt, _generation_params(body, limits, max_tokens))


def parse_tokenize_request(body: dict[str, Any], limits: RequestLimits) -> TokenizeRequest:
    check_model(body, limits)
    add_special_tokens = _optional_bool(body, "add_special_tokens", default=True)
    if "messages" in body:
        if not isinstance(body["messages"], list) or not body["messages"]:
            raise RequestError("`messages` must be a non-empty list of messages.", "messages")
        if not _optional_bool(body, "add_generation_prompt", default=True):
            raise RequestError("Only add_generation_prompt=true is supported.", "add_generation_prompt")
        if _optional_bool(body, "continue_final_message", default=False):
            raise RequestError("continue_final_message is not supported.", "continue_final_message")
        _tools(body)
        return TokenizeRequest(None, body, add_special_tokens)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise RequestError("Give either `prompt` (a string) or chat `messages`.", "prompt")
    return TokenizeRequest(prompt, None, add_special_tokens)


def parse_detokenize_request(body: dict[str, Any], limits: RequestLimits) -> list[int]:
    check_model(body, limits)
    return _token_ids(body.get("tokens"), "tokens", limits.vocab_size, allow_empty=True)


def check_model(body: dict[str, Any], limits: RequestLimits) -> None:
    """An absent model means the served one; any other name is a 404."""
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise RequestError("`model` must be a string.", "model")
    if model != limits.served_model_name:
        raise UnknownModelError(model)


def _generation_params(body: dict[str, Any], limits: RequestLimits,
                       max_tokens: Optional[int]) -> GenerationParams:
    _check_greedy(body, limits)
    stream = _optional_bool(body, "stream", default=False)
    _optional_int(body, "seed", minimum=None)  # accepted; greedy decoding does not use it
    return GenerationParams(
        stream=stream,
        include_usage=_include_usage(body, stream),
        max_tokens=max_tokens,
        stop=_stop_strings(body.get("stop")),
        logit_bias=_logit_bias(body.get("logit_bias"), limits.vocab_size),
        ignore_eos=_optional_bool(body, "ignore_eos", default=False),
    )


def _check_greedy(body: dict[str, Any], limits: RequestLimits) -> None:
    temperature = _optional_number(body, "temperature")
    if temperature is None:
        temperature = limits.default_temperature
        if temperature > 0:
            raise RequestError(f"The server's generate-config default temperature is {temperature}, "
                               f"but {GREEDY_ONLY}; send temperature 0.", "temperature")
    if temperature < 0:
        raise RequestError("`temperature` must be >= 0.", "temperature")
    if temperature > 0:
        raise RequestError(f"temperature {temperature} is not supported: {GREEDY_ONLY} "
                           "(use temperature 0 or leave it out).", "temperature")
    top_p = _optional_number(body, "top_p")
    if top_p is not None and not (0 < top_p <= 1):
        raise RequestError("`top_p` must be in (0, 1].", "top_p")
    if top_p is not None and top_p < 1:
        raise RequestError(f"top_p {top_p} is not supported: {GREEDY_ONLY} (use top_p 1).", "top_p")
    top_k = _optional_int(body, "top_k", minimum=-1)
    if top_k is not None and top_k > 1:
        raise RequestError(f"top_k {top_k} is not supported: {GREEDY_ONLY}.", "top_k")
    n = _optional_int(body, "n", minimum=1)
    if n is not None and n > 1:
        raise RequestError(f"n={n} is not supported: {GREEDY_ONLY}, so every choice would be "
                           "identical; send n=1.", "n")
    for penalty, neutral in (("presence_penalty", 0), ("frequency_penalty", 0),
                             ("repetition_penalty", 1)):
        value = _optional_number(body, penalty)
        if value is not None and value != neutral:
            raise RequestError(f"`{penalty}` is not supported: {GREEDY_ONLY}.", penalty)


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise RequestError("`stream_options` must be an object.", "stream_options")
    if not stream:
        raise RequestError("`stream_options` is only allowed when `stream` is true.", "stream_options")
    return _optional_bool(options, "include_usage", default=False, path="stream_options.include_usage")


def _max_tokens(body: dict[str, Any]) -> Optional[int]:
    legacy = _optional_int(body, "max_tokens", minimum=1)
    current = _optional_int(body, "max_completion_tokens", minimum=1)
    if legacy is not None and current is not None and legacy != current:
        raise RequestError("`max_tokens` and `max_completion_tokens` disagree; send one of them.",
                           "max_completion_tokens")
    return current if current is not None else legacy


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError("`stop` must be a string or a list of strings.", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise RequestError(f"`stop` takes at most {MAX_STOP_STRINGS} strings, got {len(stop)}.", "stop")
    if any(s == "" for s in stop):
        raise RequestError("`stop` strings must not be empty.", "stop")
    return tuple(stop)


def _logit_bias(bias: Any, vocab_size: int) -> tuple[tuple[int, float], ...]:
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise RequestError("`logit_bias` must be an object mapping token ids to biases.", "logit_bias")
    entries = []
    for key, value in bias.items():
        param = f"logit_bias.{_brief(key, 20)}"
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < vocab_size):
            raise RequestError(f"logit_bias keys must be token ids in [0, {vocab_size}), "
                               f"got {_brief(key)}.", param)
        if not _is_number(value) or not (-100 <= value <= 100):
            raise RequestError(f"logit_bias values must be numbers in [-100, 100], got {_brief(value)}.",
                               param)
        entries.append((int(key), float(value)))
    return tuple(entries)


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("`tools` must be a list.", "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise RequestError('Each tool must be {"type": "function", "function": {...}}.',
                               f"tools[{i}]")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise RequestError("Each tool needs a function name.", f"tools[{i}].function.name")
    return tools


def _check_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> None:
    if choice is None or choice in ("none", "auto"):
        return
    if choice == "required":
        if not tools:
            raise RequestError('tool_choice "required" needs at least one tool in `tools`.',
                               "tool_choice")
        return
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or choice.get("type") != "function":
        raise RequestError('tool_choice must be "none", "auto", "required" or '
                           '{"type": "function", "function": {"name": ...}}.', "tool_choice")
    if name not in {t["function"]["name"] for t in tools}:
        raise RequestError(f"tool_choice names the tool {_brief(name)}, which is not declared in "
                           "`tools`.", "tool_choice.function.name")


def _check_response_format(response_format: Any) -> None:
    if response_format is None:
        return
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise RequestError('response_format.type must be "text", "json_object" or "json_schema".',
                           "response_format.type")
    if kind == "json_schema" and not isinstance(response_format.get("json_schema"), dict):
        raise RequestError('response_format "json_schema" needs a `json_schema` object.',
                           "response_format.json_schema")


def _completion_prompt(prompt: Any, vocab_size: int) -> Union[str, list[int]]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("`prompt` must not be empty.", "prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError("Only one prompt per request is supported.", "prompt")
    return _token_ids(prompt, "prompt", vocab_size, allow_empty=False)


def _token_ids(ids: Any, param: str, vocab_size: int, allow_empty: bool) -> list[int]:
    if not isinstance(ids, list) or (not ids and not allow_empty):
        raise RequestError(f"`{param}` must be a {'' if allow_empty else 'non-empty '}"
                           "string or list of token ids.", param)
    for i, token in enumerate(ids):
        if not (isinstance(token, int) and not isinstance(token, bool) and 0 <= token < vocab_size):
            raise RequestError(f"Token ids must be integers in [0, {vocab_size}), got {_brief(token)}.",
                               f"{param}[{i}]")
    return ids


def _optional_int(body: dict[str, Any], key: str, minimum: Optional[int]) -> Optional[int]:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(f"`{key}` must be an integer, got {_brief(value)}.", key)
    if minimum is not None and value < minimum:
        raise RequestError(f"`{key}` must be >= {minimum}, got {value}.", key)
    return value


def _optional_number(body: dict[str, Any], key: str) -> Optional[float]:
    value = body.get(key)
    if value is None:
        return None
    if not _is_number(value):
        raise RequestError(f"`{key}` must be a number, got {_brief(value)}.", key)
    return float(value)


def _optional_bool(body: dict[str, Any], key: str, default: bool, path: Optional[str] = None) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"`{path or key}` must be true or false, got {_brief(value)}.", path or key)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _brief(value: Any, limit: int = 60) -> str:
    """A short rendering of client input for error messages (never echo large bodies)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= limit else text[:limit] + "…"
