"""OpenAI chat-completions request → DeepSeek-V4 prompt text, byte-exact with DeepSeek's encoder.

The rendering rules are those of the official `encoding_dsv4.py` (V4-Pro/V4-Flash, sha256
`bdbd57c1…`); the request → encoder mapping is the one pinned by
`shared/conformance/chat-encoding/README.md`:
  * tools / response_format attach to the first system message (one is inserted at index 0);
  * tool messages become `<tool_result>` blocks merged into one user turn, reordered by the
    preceding assistant's call ids; consecutive user messages merge too;
  * thinking mode drops earlier reasoning and developer turns unless any message carries tools.

The encoder itself (`chat_encoder.py`) also marks which characters are template markup, so that
only those can become control tokens (README, "Special tokens in content are text").

Policy choices the conformance suite leaves open:
  * `response_format: {"type": "text"}` means "plain text" and renders nothing.
  * a `reasoning_effort` other than "max"/"high" (e.g. "low") renders nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from services.common.config import RequestBounds
from services.frontend.chat_encoder import EncoderOptions, encode_messages
from services.frontend.chat_messages import ChatMessage, parse_messages
from services.frontend.errors import RequestError

@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    thinking: bool
    markup_spans: tuple[tuple[int, int], ...] = ()   # the template's own markup (chat_encoder)


def is_deepseek_v4(config_json: dict[str, Any]) -> bool:
    """Model detection by `config.json` `model_type`: survives any `--served-model-name` alias."""
    return config_json.get("model_type") == "deepseek_v4"


def render_chat_request(body: dict[str, Any],
                        max_json_depth: int = RequestBounds().max_json_depth) -> RenderedPrompt:
    """Render the prompt for an OpenAI chat request (generation prompt included).

    Raises `RequestError` (→ HTTP 400) naming the offending field for malformed input.
    `tool_choice` never changes the prompt: it is enforced by decoding and parsing.
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", None)
    messages = parse_messages(body.get("messages"), max_json_depth)
    messages = _attach_to_system(messages, _request_tools(body), _request_response_format(body))
    options = encoder_options(body)
    prompt = encode_messages(messages, options)
    return RenderedPrompt(prompt.text, options.thinking, prompt.markup_spans)


def encoder_options(body: dict[str, Any]) -> EncoderOptions:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    thinking = _optional_bool(kwargs, "thinking")
    if thinking is None:
        thinking = _optional_bool(kwargs, "enable_thinking")
    drop_thinking = _optional_bool(kwargs, "drop_thinking")
    effort = body.get("reasoning_effort")
    effort_param = "reasoning_effort"
    if effort is None:
        effort, effort_param = kwargs.get("reasoning_effort"), "chat_template_kwargs.reasoning_effort"
    if effort is not None and not isinstance(effort, str):
        raise RequestError(f"{effort_param} must be a string", effort_param)
    return EncoderOptions(
        thinking=bool(thinking),
        drop_thinking=True if drop_thinking is None else drop_thinking,
        reasoning_effort=effort if effort in ("max", "high") else None,
    )


def _optional_bool(kwargs: dict[str, Any], key: str) -> Optional[bool]:
    value = kwargs.get(key)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"chat_template_kwargs.{key} must be a boolean",
                           f"chat_template_kwargs.{key}")
    return value


def _request_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools must be an array", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise RequestError(f"tools[{i}].function is required (an object)", f"tools[{i}].function")
    return tools


def _request_response_format(body: dict[str, Any]) -> Optional[dict[str, Any]]:
    response_format = body.get("response_format")
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise RequestError("response_format must be an object", "response_format")
    if response_format == {"type": "text"}:
        return None
    return response_format


def _attach_to_system(messages: list[ChatMessage], tools: list[dict[str, Any]],
                      response_format: Optional[dict[str, Any]]) -> list[ChatMessage]:
    """Tools and response_format go to the first system message, wherever it is (never developer)."""
    if not tools and not response_format:
        return messages
    messages = list(messages)
    index = next((i for i, m in enumerate(messages) if m.role == "system"), None)
    if index is None:
        messages.insert(0, ChatMessage(role="system", content=""))
        index = 0
    messages[index] = replace(messages[index], tools=tools or None, response_format=response_format)
    return messages
