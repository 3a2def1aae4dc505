"""OpenAI chat messages → validated, whitelisted messages for the DeepSeek-V4 encoder.

Only the fields the official encoder understands survive (README of the chat-encoding conformance
suite, "Messages are whitelisted"); everything else a client sends on a message (`name`, the encoder's
internal keys `task`, `wo_eos`, `tools`, …) is ignored. Every structural problem becomes a
`RequestError` whose `param` is the JSON path of the offending field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from services.frontend.errors import RequestError
from services.frontend.request_body import JsonTooDeep, nesting_depth

ROLES = ("system", "user", "developer", "assistant", "tool", "latest_reminder")


@dataclass(frozen=True)
class HistoryToolCall:
    """A call of an earlier assistant turn; `arguments`: the client's JSON object, key order kept."""

    call_id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class ChatMessage:
    role: str
    content: str = ""
    reasoning_content: Optional[str] = None            # assistant only
    tool_calls: list[HistoryToolCall] = field(default_factory=list)  # assistant only
    tool_call_id: str = ""                               # tool only
    tools: Optional[list[dict[str, Any]]] = None         # system only (request-level tools)
    response_format: Optional[dict[str, Any]] = None     # system only


def parse_messages(raw: Any, max_json_depth: int) -> list[ChatMessage]:
    """`max_json_depth`: how deep the JSON of an earlier call's arguments may nest."""
    if not isinstance(raw, list) or not raw:
        raise RequestError("'messages' must be a non-empty array", "messages")
    return [_parse_message(item, f"messages[{i}]", max_json_depth) for i, item in enumerate(raw)]


def _parse_message(raw: Any, path: str, max_json_depth: int) -> ChatMessage:
    if not isinstance(raw, dict):
        raise RequestError(f"{path} must be an object", path)
    role = raw.get("role")
    if role is None:
        raise RequestError(f"{path}.role is required", f"{path}.role")
    if role not in ROLES:
        raise RequestError(f"{path}.role {role!r} is not one of {', '.join(ROLES)}", f"{path}.role")
    message = ChatMessage(role=role, content=_content_text(raw, role, path))
    if role == "developer" and not message.content:
        raise RequestError(f"{path}.content must not be empty for a developer message",
                           f"{path}.content")
    if role == "assistant":
        message.reasoning_content = _optional_string(raw, "reasoning_content", path)
        message.tool_calls = _history_tool_calls(raw.get("tool_calls"), f"{path}.tool_calls",
                                                 max_json_depth)
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if not isinstance(call_id, str):
            raise RequestError(f"{path}.tool_call_id is required (a string) on a tool message",
                               f"{path}.tool_call_id")
        message.tool_call_id = call_id
    return message


def _content_text(raw: dict[str, Any], role: str, path: str) -> str:
    """String content as is; a list of text parts joined with "\\n\\n" (the encoder's block join)."""
    content = raw.get("content")
    if content is None:
        # The encoder renders a missing system/assistant content as "", nothing else may omit it.
        if role in ("assistant", "system"):
            return ""
        raise RequestError(f"{path}.content is required for a {role} message", f"{path}.content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{path}.content must be a string or an array of content parts",
                           f"{path}.content")
    return "\n\n".join(_text_part(part, f"{path}.content[{j}]") for j, part in enumerate(content))


def _text_part(part: Any, path: str) -> str:
    if not isinstance(part, dict):
        raise RequestError(f"{path} must be a content-part object", path)
    kind = part.get("type")
    if kind != "text":
        raise RequestError(f"{path}.type {kind!r} is not supported: this model accepts only "
                           "'text' content parts", f"{path}.type")
    text = part.get("text")
    if not isinstance(text, str):
        raise RequestError(f"{path}.text must be a string", f"{path}.text")
    return text


def _optional_string(raw: dict[str, Any], key: str, path: str) -> Optional[str]:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise RequestError(f"{path}.{key} must be a string", f"{path}.{key}")
    return value


def _history_tool_calls(raw: Any, path: str, max_json_depth: int) -> list[HistoryToolCall]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise RequestError(f"{path} must be an array", path)
    return [_history_tool_call(call, f"{path}[{j}]", max_json_depth) for j, call in enumerate(raw)]


def _history_tool_call(raw: Any, path: str, max_json_depth: int) -> HistoryToolCall:
    if not isinstance(raw, dict):
        raise RequestError(f"{path} must be an object", path)
    call_id = raw.get("id") or ""
    if not isinstance(call_id, str):
        raise RequestError(f"{path}.id must be a string", f"{path}.id")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise RequestError(f"{path}.function is required (an object)", f"{path}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError(f"{path}.function.name must be a non-empty string",
                           f"{path}.function.name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        raise RequestError(f"{path}.function.arguments must be a JSON string",
                           f"{path}.function.arguments")
    return HistoryToolCall(call_id, name, _history_arguments(arguments, f"{path}.function.arguments",
                                                             max_json_depth))


def _history_arguments(text: str, path: str, max_json_depth: int) -> dict[str, Any]:
    """The official encoder's rule: text that is not JSON becomes one parameter named `arguments`.

    Valid JSON that is not an object (an array, a number, a string) has no parameters to render; the
    official encoder crashes on it, so it is a client error here, as is JSON nested deeper than
    `max_json_depth` (it would exhaust the parser's recursion).
    """
    depth = nesting_depth(text.encode("utf-8", "surrogatepass"))
    if depth > max_json_depth:
        raise JsonTooDeep(depth, max_json_depth, path)
    try:
        value = json.loads(text)
    except ValueError:
        return {"arguments": text}
    if not isinstance(value, dict):
        raise RequestError(f"{path} must encode a JSON object, got {type(value).__name__}", path)
    return value
