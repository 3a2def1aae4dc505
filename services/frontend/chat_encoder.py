"""DeepSeek-V4 messages → prompt text, byte-exact with the official `encoding_dsv4.py`, rendered as
segments that remember which characters are the template's own markup.

The text is the reference encoder's, unchanged. The markup spans let the tokenizer give control
tokens only to the template (turn markers, think tags, the DSML of earlier calls, the tools
section's instructions): everything that came from the client (message and reasoning content, tool
results, tool schemas, names and arguments of earlier calls) is tokenized as plain text, so a tool
result that spells `<｜User｜>` cannot forge a turn (`tokenizer.Dsv4Tokenizer.encode_prompt`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

from services.frontend import dsv4_tokens as tok
from services.frontend.chat_messages import ChatMessage, HistoryToolCall

Segment = tuple[str, bool]   # (text, is template markup)

REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
    "and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

TOOLS_SECTION_HEAD = f"""## Tools

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

"""
TOOLS_SECTION_TAIL = """

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""
RESPONSE_FORMAT_HEAD = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
)


@dataclass(frozen=True)
class EncoderOptions:
    """The official encoder's knobs, read from the request."""

    thinking: bool
    drop_thinking: bool
    reasoning_effort: Optional[str]  # "max", "high" or None


@dataclass(frozen=True)
class PromptText:
    text: str
    markup_spans: tuple[tuple[int, int], ...]   # [start, end) character ranges of template markup


@dataclass
class _Block:
    text: str
    tool_call_id: Optional[str] = None  # set for a tool result


@dataclass
class _UserTurn:
    """User messages and tool results merged into one turn, in order."""

    blocks: list[_Block]
    call_order: dict[str, int]   # call id → position in the latest assistant turn that made calls
    role: str = "user"
    tools: None = None


_Message = Union[ChatMessage, _UserTurn]


def markup(text: str) -> Segment:
    return (text, True)


def content(text: str) -> Segment:
    return (text, False)


def join_segments(segments: list[Segment]) -> PromptText:
    spans, offset = [], 0
    for text, is_markup in segments:
        if is_markup and text:
            if spans and spans[-1][1] == offset:
                spans[-1] = (spans[-1][0], offset + len(text))
            else:
                spans.append((offset, offset + len(text)))
        offset += len(text)
    return PromptText("".join(text for text, _ in segments), tuple(spans))


def encode_messages(messages: list[ChatMessage], options: EncoderOptions) -> PromptText:
    """BOS + every message rendered in turn (the official `encode_messages`, no context prefix)."""
    merged = merge_tool_results(messages)
    # Any message carrying tools switches drop_thinking off (so every user turn primes <think>).
    drop = options.drop_thinking and not any(m.tools for m in merged)
    if options.thinking and drop:
        merged = _drop_earlier_thinking(merged)
    last_user = _last_user_index(merged)
    segments = [markup(tok.BOS)]
    for index in range(len(merged)):
        segments += _render_message(index, merged, last_user, options, drop)
    return join_segments(segments)


def merge_tool_results(messages: list[ChatMessage]) -> list[_Message]:
    """Tool messages → `<tool_result>` blocks inside user turns; adjacent user/tool messages merge.

    Within a merged turn, tool results are stably reordered by the call order of the latest assistant
    message that made calls (an unknown id sorts as position 0); text blocks keep their slots.
    """
    merged: list[_Message] = []
    call_order: dict[str, int] = {}
    for message in messages:
        if message.role not in ("user", "tool"):
            if message.role == "assistant" and message.tool_calls:
                call_order = {c.call_id: i for i, c in enumerate(message.tool_calls) if c.call_id}
            merged.append(message)
            continue
        block = _Block(message.content, message.tool_call_id if message.role == "tool" else None)
        if not merged or not isinstance(merged[-1], _UserTurn):
            merged.append(_UserTurn([], call_order))
        merged[-1].blocks.append(block)
    for item in merged:
        if isinstance(item, _UserTurn):
            item.blocks = _in_call_order(item.blocks, item.call_order)
    return merged


def _in_call_order(blocks: list[_Block], call_order: dict[str, int]) -> list[_Block]:
    results = [b for b in blocks if b.tool_call_id is not None]
    if len(results) < 2 or not call_order:
        return blocks
    ordered = iter(sorted(results, key=lambda b: call_order.get(b.tool_call_id or "", 0)))
    return [next(ordered) if b.tool_call_id is not None else b for b in blocks]


def _user_turn(turn: _UserTurn) -> list[Segment]:
    segments: list[Segment] = []
    for index, block in enumerate(turn.blocks):
        if index:
            segments.append(markup("\n\n"))
        if block.tool_call_id is None:
            segments.append(content(block.text))
        else:
            segments += [markup("<tool_result>"), content(block.text), markup("</tool_result>")]
    return segments


def _last_user_index(messages: list[_Message]) -> int:
    """Index of the last user/developer message; -1 when there is none (then nothing is dropped)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role in ("user", "developer"):
            return index
    return -1


def _drop_earlier_thinking(messages: list[_Message]) -> list[_Message]:
    """Before the last user turn: assistant reasoning is removed, developer turns vanish."""
    last_user = _last_user_index(messages)
    kept: list[_Message] = []
    for index, message in enumerate(messages):
        if index >= last_user or message.role in ("user", "system", "latest_reminder"):
            kept.append(message)
        elif isinstance(message, ChatMessage) and message.role == "assistant":
            kept.append(replace(message, reasoning_content=None))
    return kept


def _render_message(index: int, messages: list[_Message], last_user: int,
                    options: EncoderOptions, drop: bool) -> list[Segment]:
    message = messages[index]
    segments = []
    if index == 0 and options.thinking and options.reasoning_effort == "max":
        segments.append(markup(REASONING_EFFORT_MAX))
    if isinstance(message, _UserTurn):
        segments += [markup(tok.USER), *_user_turn(message)]
    elif message.role == "system":
        segments += [content(message.content), *_system_sections(message)]
    elif message.role == "developer":
        segments += [markup(tok.USER), content(message.content)]
    elif message.role == "latest_reminder":
        segments += [markup(tok.LATEST_REMINDER), content(message.content)]
    else:
        keep_reasoning = options.thinking and (not drop or index > last_user)
        segments += _render_assistant(message, keep_reasoning)
    return segments + _transition(index, messages, last_user, options, drop)


def _system_sections(message: ChatMessage) -> list[Segment]:
    segments = []
    if message.tools:
        schemas = "\n".join(_python_json(tool["function"]) for tool in message.tools)
        segments += [markup("\n\n" + TOOLS_SECTION_HEAD), content(schemas),
                     markup(TOOLS_SECTION_TAIL)]
    if message.response_format:
        segments += [markup("\n\n" + RESPONSE_FORMAT_HEAD),
                     content(_python_json(message.response_format))]
    return segments


def _render_assistant(message: ChatMessage, keep_reasoning: bool) -> list[Segment]:
    segments = []
    if keep_reasoning:
        segments += [content(message.reasoning_content or ""), markup(tok.THINK_END)]
    segments.append(content(message.content))
    if message.tool_calls:
        segments.append(markup(f"\n\n<{tok.DSML}tool_calls>\n"))
        for index, call in enumerate(message.tool_calls):
            segments += ([markup("\n")] if index else []) + _render_invoke(call)
        segments.append(markup(f"\n</{tok.DSML}tool_calls>"))
    return segments + [markup(tok.EOS)]


def _render_invoke(call: HistoryToolCall) -> list[Segment]:
    segments = [markup(f'<{tok.DSML}invoke name="'), content(call.name), markup('">\n')]
    for index, (key, value) in enumerate(call.arguments.items()):
        is_string = isinstance(value, str)
        segments += [markup(("\n" if index else "") + f'<{tok.DSML}parameter name="'),
                     content(key), markup(f'" string="{"true" if is_string else "false"}">'),
                     content(value if is_string else _python_json(value)),
                     markup(f"</{tok.DSML}parameter>")]
    return segments + [markup(f"\n</{tok.DSML}invoke>")]


def _transition(index: int, messages: list[_Message], last_user: int,
                options: EncoderOptions, drop: bool) -> list[Segment]:
    """The generation prompt after a user/developer turn that ends the list or precedes the model."""
    if index + 1 < len(messages) and messages[index + 1].role not in ("assistant", "latest_reminder"):
        return []
    if messages[index].role not in ("user", "developer"):
        return []
    opens_thinking = options.thinking and (not drop or index >= last_user)
    return [markup(tok.ASSISTANT + (tok.THINK_START if opens_thinking else tok.THINK_END))]


def _python_json(value: Any) -> str:
    """Python's default `json.dumps` separators (", ", ": "), raw non-ASCII, key order kept."""
    return json.dumps(value, ensure_ascii=False)
