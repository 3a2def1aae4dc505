"""OpenAI chat-completions request → DeepSeek-V4 prompt text, byte-exact with DeepSeek's encoder.

The rendering rules are those of the official `encoding_dsv4.py` (V4-Pro/V4-Flash, sha256
`bdbd57c1…`); the request → encoder mapping is the one pinned by
`shared/conformance/chat-encoding/README.md`:
  * tools / response_format attach to the first system message (one is inserted at index 0);
  * tool messages become `<tool_result>` blocks merged into one user turn, reordered by the
    preceding assistant's call ids; consecutive user messages merge too;
  * thinking mode drops earlier reasoning and developer turns unless any message carries tools.

Policy choices the conformance suite leaves open:
  * `response_format: {"type": "text"}` means "plain text" and renders nothing.
  * a `reasoning_effort` other than "max"/"high" (e.g. "low") renders nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Optional

from services.frontend import dsv4_tokens as tok
from services.frontend.chat_messages import ChatMessage, HistoryToolCall, parse_messages
from services.frontend.errors import RequestError

REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
    "and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

TOOLS_SECTION = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{tok.DSML}tool_calls>" block like the following:

<{tok.DSML}tool_calls>
<{tok.DSML}invoke name="$TOOL_NAME">
<{tok.DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{tok.DSML}parameter>
...
</{tok.DSML}invoke>
<{tok.DSML}invoke name="$TOOL_NAME2">
...
</{tok.DSML}invoke>
</{tok.DSML}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {tok.THINK_START}), you MUST output your complete reasoning inside {tok.THINK_START}...{tok.THINK_END} BEFORE any tool calls or final response.

Otherwise, output directly after {tok.THINK_END} with tool calls or final response.

### Available Tool Schemas

{{tool_schemas}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""

RESPONSE_FORMAT_SECTION = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{schema}"
)


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    thinking: bool


@dataclass(frozen=True)
class EncoderOptions:
    """The official encoder's knobs, read from the request."""

    thinking: bool
    drop_thinking: bool
    reasoning_effort: Optional[str]  # "max", "high" or None


def is_deepseek_v4(config_json: dict[str, Any]) -> bool:
    """Model detection by `config.json` `model_type`: survives any `--served-model-name` alias."""
    return config_json.get("model_type") == "deepseek_v4"


def render_chat_request(body: dict[str, Any]) -> RenderedPrompt:
    """Render the prompt for an OpenAI chat request (generation prompt included).

    Raises `RequestError` (→ HTTP 400) naming the offending field for malformed input.
    `tool_choice` never changes the prompt: it is enforced by decoding and parsing.
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", None)
    messages = parse_messages(body.get("messages"))
    messages = _attach_to_system(messages, _request_tools(body), _request_response_format(body))
    options = encoder_options(body)
    return RenderedPrompt(encode_messages(messages, options), options.thinking)


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


# --- the encoder ---------------------------------------------------------------------------------

def encode_messages(messages: list[ChatMessage], options: EncoderOptions) -> str:
    """BOS + every message rendered in turn (the official `encode_messages`, no context prefix)."""
    messages = merge_tool_results(messages)
    # Any message carrying tools switches drop_thinking off (so every user turn primes <think>).
    drop = options.drop_thinking and not any(m.tools for m in messages)
    if options.thinking and drop:
        messages = _drop_earlier_thinking(messages)
    last_user = _last_user_index(messages)
    parts = [tok.BOS]
    for index in range(len(messages)):
        parts.append(_render_message(index, messages, last_user, options, drop))
    return "".join(parts)


@dataclass
class _Block:
    text: str
    tool_call_id: Optional[str] = None  # set for a tool result


def merge_tool_results(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Tool messages → `<tool_result>` blocks inside user turns; adjacent user/tool messages merge.

    Within a merged turn, tool results are stably reordered by the call order of the latest assistant
    message that made calls (an unknown id sorts as position 0); text blocks keep their slots.
    """
    merged: list[ChatMessage | list[_Block]] = []
    for message in messages:
        if message.role in ("user", "tool"):
            block = (_Block(message.content) if message.role == "user"
                     else _Block(message.content, message.tool_call_id))
            if merged and isinstance(merged[-1], list):
                merged[-1].append(block)
            else:
                merged.append([block])
        else:
            merged.append(message)
    out: list[ChatMessage] = []
    call_order: dict[str, int] = {}
    for item in merged:
        if isinstance(item, ChatMessage):
            if item.role == "assistant" and item.tool_calls:
                call_order = {c.call_id: i for i, c in enumerate(item.tool_calls) if c.call_id}
            out.append(item)
        else:
            out.append(ChatMessage(role="user", content=_user_turn_text(item, call_order)))
    return out


def _user_turn_text(blocks: list[_Block], call_order: dict[str, int]) -> str:
    results = [b for b in blocks if b.tool_call_id is not None]
    if len(results) > 1 and call_order:
        ordered = iter(sorted(results, key=lambda b: call_order.get(b.tool_call_id or "", 0)))
        blocks = [next(ordered) if b.tool_call_id is not None else b for b in blocks]
    return "\n\n".join(b.text if b.tool_call_id is None else f"<tool_result>{b.text}</tool_result>"
                       for b in blocks)


def _last_user_index(messages: list[ChatMessage]) -> int:
    """Index of the last user/developer message; -1 when there is none (then nothing is dropped)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role in ("user", "developer"):
            return index
    return -1


def _drop_earlier_thinking(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Before the last user turn: assistant reasoning is removed, developer turns vanish."""
    last_user = _last_user_index(messages)
    kept: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if index >= last_user or message.role in ("user", "system", "latest_reminder"):
            kept.append(message)
        elif message.role == "assistant":
            kept.append(replace(message, reasoning_content=None))
    return kept


def _render_message(index: int, messages: list[ChatMessage], last_user: int,
                    options: EncoderOptions, drop: bool) -> str:
    message = messages[index]
    prefix = ""
    if index == 0 and options.thinking and options.reasoning_effort == "max":
        prefix = REASONING_EFFORT_MAX
    if message.role == "system":
        body = message.content + _system_sections(message)
    elif message.role in ("user", "developer"):
        body = tok.USER + message.content
    elif message.role == "latest_reminder":
        body = tok.LATEST_REMINDER + message.content
    else:
        keep_reasoning = options.thinking and (not drop or index > last_user)
        body = _render_assistant(message, keep_reasoning)
    return prefix + body + _transition(index, messages, last_user, options, drop)


def _system_sections(message: ChatMessage) -> str:
    sections = ""
    if message.tools:
        schemas = "\n".join(_python_json(tool["function"]) for tool in message.tools)
        sections += "\n\n" + TOOLS_SECTION.format(tool_schemas=schemas)
    if message.response_format:
        sections += "\n\n" + RESPONSE_FORMAT_SECTION.format(
            schema=_python_json(message.response_format))
    return sections


def _render_assistant(message: ChatMessage, keep_reasoning: bool) -> str:
    reasoning = (message.reasoning_content or "") + tok.THINK_END if keep_reasoning else ""
    calls = ""
    if message.tool_calls:
        invokes = "\n".join(_render_invoke(call) for call in message.tool_calls)
        calls = f"\n\n<{tok.DSML}tool_calls>\n{invokes}\n</{tok.DSML}tool_calls>"
    return reasoning + message.content + calls + tok.EOS


def _render_invoke(call: HistoryToolCall) -> str:
    parameters = "\n".join(
        f'<{tok.DSML}parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
        f'{value if isinstance(value, str) else _python_json(value)}</{tok.DSML}parameter>'
        for key, value in call.arguments.items())
    return f'<{tok.DSML}invoke name="{call.name}">\n{parameters}\n</{tok.DSML}invoke>'


def _transition(index: int, messages: list[ChatMessage], last_user: int,
                options: EncoderOptions, drop: bool) -> str:
    """The generation prompt after a user/developer turn that ends the list or precedes the model."""
    if index + 1 < len(messages) and messages[index + 1].role not in ("assistant", "latest_reminder"):
        return ""
    if messages[index].role not in ("user", "developer"):
        return ""
    opens_thinking = options.thinking and (not drop or index >= last_user)
    return tok.ASSISTANT + (tok.THINK_START if opens_thinking else tok.THINK_END)


def _python_json(value: Any) -> str:
    """Python's default `json.dumps` separators (", ", ": "), raw non-ASCII, key order kept."""
    return json.dumps(value, ensure_ascii=False)
