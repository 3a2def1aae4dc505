"""OpenAI request bodies → typed requests, or a `RequestError` naming the offending field.

`openai_types` checks wire types and ranges; this module adds what depends on the deployment:
the served model name, the vocabulary, greedy-only sampling, the server's bounds, and the fields
this server does not implement. Messages and tools are validated further by `chat_format` and
`constraints`, which know their rules. Error messages never quote more than a few dozen characters
of the client's input.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Union

from services.frontend import openai_types as wire
from services.frontend.errors import RequestError

GREEDY_ONLY = "only greedy decoding is supported"


class UnknownModelError(RequestError):
    """The request names a model this deployment does not serve → HTTP 404."""

    status = 404

    def __init__(self, model: str) -> None:
        super().__init__(f"The model {_brief(model)} does not exist; this server serves one model.",
                         "model", "model_not_found")


@dataclass(frozen=True)
class RequestLimits:
    """What validation needs to know about the deployment."""

    served_model_name: str
    vocab_size: int
    default_temperature: float
    max_tools: int
    max_json_depth: int


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
class TextRequest:
    prompt: Union[str, list[int]]
    params: GenerationParams


@dataclass(frozen=True)
class TokenizeRequest:
    """Exactly one of `prompt` and `chat_body` is set."""

    prompt: Optional[str]
    chat_body: Optional[dict[str, Any]]
    add_special_tokens: bool


def parse_chat_request(body: dict[str, Any], limits: RequestLimits) -> ChatRequest:
    request = wire.validate(wire.ChatCompletionRequest, body)
    check_model(request.model, limits)
    if request.logprobs or request.top_logprobs is not None:
        raise RequestError("logprobs are not supported by this server.", "logprobs")
    _check_tools(request.tools, limits)
    _check_tool_choice(request.tool_choice, request.tools or [])
    if request.response_format is not None and request.response_format.type == "json_schema" \
            and request.response_format.json_schema is None:
        raise RequestError('response_format "json_schema" needs a `json_schema` object.',
                           "response_format.json_schema")
    max_tokens = _max_tokens(request)
    return ChatRequest(body, body.get("tools") or [], _generation_params(request, limits, max_tokens))


def parse_completion_request(body: dict[str, Any], limits: RequestLimits) -> TextRequest:
    request = wire.validate(wire.CompletionRequest, body)
    check_model(request.model, limits)
    prompt = _completion_prompt(request.prompt, limits.vocab_size)
    if request.logprobs is not None:
        raise RequestError("logprobs are not supported by this server.", "logprobs")
    if request.echo:
        raise RequestError("`echo` is not supported by this server.", "echo")
    if request.suffix is not None:
        raise RequestError("`suffix` is not supported by this server.", "suffix")
    if request.best_of not in (None, 1):
        raise RequestError(f"`best_of` must be 1: {GREEDY_ONLY}.", "best_of")
    return TextRequest(prompt, _generation_params(request, limits, request.max_tokens))


def parse_tokenize_request(body: dict[str, Any], limits: RequestLimits) -> TokenizeRequest:
    request = wire.validate(wire.TokenizeRequest, body)
    check_model(request.model, limits)
    add_special_tokens = request.add_special_tokens is not False
    if request.messages is not None:
        if request.add_generation_prompt is False:
            raise RequestError("Only add_generation_prompt=true is supported.", "add_generation_prompt")
        if request.continue_final_message:
            raise RequestError("continue_final_message is not supported.", "continue_final_message")
        _check_tools(request.tools, limits)
        return TokenizeRequest(None, body, add_special_tokens)
    if request.prompt is None:
        raise RequestError("Give either `prompt` (a string) or chat `messages`.", "prompt")
    return TokenizeRequest(request.prompt, None, add_special_tokens)


def parse_detokenize_request(body: dict[str, Any], limits: RequestLimits) -> list[int]:
    request = wire.validate(wire.DetokenizeRequest, body)
    check_model(request.model, limits)
    return _token_ids(request.tokens, "tokens", limits.vocab_size, allow_empty=True)


def check_model(model: Optional[str], limits: RequestLimits) -> None:
    """An absent model means the served one; any other name is a 404."""
    if model is not None and model != limits.served_model_name:
        raise UnknownModelError(model)


def _generation_params(request: wire.SamplingFields, limits: RequestLimits,
                       max_tokens: Optional[int]) -> GenerationParams:
    _check_greedy(request, limits)
    stream = bool(request.stream)
    if request.stream_options is not None and not stream:
        raise RequestError("`stream_options` is only allowed when `stream` is true.", "stream_options")
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return GenerationParams(stream=stream, include_usage=include_usage, max_tokens=max_tokens,
                            stop=_stop_strings(request.stop),
                            logit_bias=_logit_bias(request.logit_bias, limits.vocab_size),
                            ignore_eos=bool(request.ignore_eos))


def _check_greedy(request: wire.SamplingFields, limits: RequestLimits) -> None:
    temperature = request.temperature
    if temperature is None and limits.default_temperature > 0:
        raise RequestError(f"The server's generate-config default temperature is "
                           f"{limits.default_temperature}, but {GREEDY_ONLY}; send temperature 0.",
                           "temperature")
    if temperature is not None and temperature > 0:
        raise RequestError(f"temperature {temperature} is not supported: {GREEDY_ONLY} "
                           "(use temperature 0 or leave it out).", "temperature")
    if request.top_p is not None and request.top_p < 1:
        raise RequestError(f"top_p {request.top_p} is not supported: {GREEDY_ONLY} (use top_p 1).",
                           "top_p")
    if request.top_k is not None and request.top_k > 1:
        raise RequestError(f"top_k {request.top_k} is not supported: {GREEDY_ONLY}.", "top_k")
    if request.n is not None and request.n > 1:
        raise RequestError(f"n={request.n} is not supported: {GREEDY_ONLY}, so every choice would "
                           "be identical; send n=1.", "n")
    for penalty, neutral in (("presence_penalty", 0), ("frequency_penalty", 0),
                             ("repetition_penalty", 1)):
        value = getattr(request, penalty)
        if value is not None and value != neutral:
            raise RequestError(f"`{penalty}` is not supported: {GREEDY_ONLY}.", penalty)


def _max_tokens(request: wire.ChatCompletionRequest) -> Optional[int]:
    legacy, current = request.max_tokens, request.max_completion_tokens
    if legacy is not None and current is not None and legacy != current:
        raise RequestError("`max_tokens` and `max_completion_tokens` disagree; send one of them.",
                           "max_completion_tokens")
    return current if current is not None else legacy


def _stop_strings(stop: Union[str, list[str], None]) -> tuple[str, ...]:
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if any(s == "" for s in stop):
        raise RequestError("`stop` strings must not be empty.", "stop")
    return tuple(stop)


def _logit_bias(bias: Optional[dict[str, float]], vocab_size: int) -> tuple[tuple[int, float], ...]:
    """Keys are 1-10 digits (checked by the model), so `int()` is cheap and bounded."""
    entries = []
    for key, value in (bias or {}).items():
        if int(key) >= vocab_size:
            raise RequestError(f"logit_bias keys must be token ids in [0, {vocab_size}), got "
                               f"{key}.", f"logit_bias.{key}")
        entries.append((int(key), value))
    return tuple(entries)


def _check_tools(tools: Optional[list[wire.Tool]], limits: RequestLimits) -> None:
    if tools is not None and len(tools) > limits.max_tools:
        raise RequestError(f"`tools` lists {len(tools)} tools; the server's limit is "
                           f"{limits.max_tools}.", "tools")
    for i, tool in enumerate(tools or []):
        if not tool.function.name:
            raise RequestError("Each tool needs a function name.", f"tools[{i}].function.name")


def _check_tool_choice(choice: Union[str, wire.NamedToolChoice, None],
                       tools: list[wire.Tool]) -> None:
    if choice == "required" and not tools:
        raise RequestError('tool_choice "required" needs at least one tool in `tools`.',
                           "tool_choice")
    if isinstance(choice, wire.NamedToolChoice) \
            and choice.function.name not in {t.function.name for t in tools}:
        raise RequestError(f"tool_choice names the tool {_brief(choice.function.name)}, which is "
                           "not declared in `tools`.", "tool_choice.function.name")


def _completion_prompt(prompt: Union[str, list[int], list[str], list[list[int]]],
                       vocab_size: int) -> Union[str, list[int]]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("`prompt` must not be empty.", "prompt")
        return prompt
    if prompt and not isinstance(prompt[0], int):
        raise RequestError("Only one prompt per request is supported.", "prompt")
    return _token_ids(prompt, "prompt", vocab_size, allow_empty=False)


def _token_ids(ids: list[Any], param: str, vocab_size: int, allow_empty: bool) -> list[int]:
    if not ids and not allow_empty:
        raise RequestError(f"`{param}` must be a non-empty string or list of token ids.", param)
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise RequestError(f"Token ids must be integers in [0, {vocab_size}), got {token}.",
                               f"{param}[{i}]")
    return ids


def _brief(value: Any, limit: int = 60) -> str:
    """A short rendering of client input for error messages (never echo large bodies)."""
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "…"
