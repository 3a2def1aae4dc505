"""DeepSeek-V4 completion text → content / reasoning / tool calls (DSML), whole or streamed.

Rules: `shared/conformance/dsml-parse/README.md` (the official parser plus the suite's ★ changes) and
`shared/spec/dsv4-chat-format.md`. Parameter values are typed by the declared schema when known,
by the `string="true|false"` flag otherwise (`dsml_schema.py`). The state machine lives in
`dsml_stream.py` (and its tool-call block in `dsml_block.py`); the non-streaming parse runs the same
machine over the whole text.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from services.frontend import dsv4_tokens as tok
from services.frontend.dsml_stream import StreamingParser
from services.frontend.dsml_types import (
    ContentDelta, Delta, DsmlParseError, ParsedMessage, ParsedToolCall, ReasoningDelta,
    StreamOutcome, ToolCallArguments, ToolCallStart, new_tool_call_id)

__all__ = [
    "ContentDelta", "Delta", "DsmlParseError", "ParsedMessage", "ParsedToolCall", "ReasoningDelta",
    "StreamOutcome", "StreamingParser", "ToolCallArguments", "ToolCallStart", "finish_reason",
    "new_tool_call_id", "parse_completion",
]


def parse_completion(text: str, thinking: bool, tools: Optional[list[dict[str, Any]]] = None,
                     stopped_on_eos: Optional[bool] = None,
                     new_call_id: Callable[[], str] = new_tool_call_id) -> ParsedMessage:
    """Parse one whole completion; raises `DsmlParseError` (with `.code`, `.partial`).

    `text` is the decoded completion with special tokens; it ends with the EOS text when the model
    stopped on EOS. Pass `stopped_on_eos=True` if the caller stripped that EOS text. A length-stopped
    completion raises (`missing_eos`, `missing_think_end` or `truncated_tool_calls`); its text is in
    the error's `partial`, and it never carries a tool call.
    """
    parser = StreamingParser(thinking, tools, new_call_id)
    parser.feed(text)
    parser.finish(stopped_on_eos=bool(stopped_on_eos) or text.endswith(tok.EOS))
    outcome = parser.outcome
    if outcome.error is not None:
        raise outcome.error
    assert outcome.message is not None
    return outcome.message


def finish_reason(stop_reason: str, completed_tool_calls: int) -> str:
    """The OpenAI `finish_reason` from the scheduler's stop reason ("stop", "length", "abort").

    "length" is never overwritten; "tool_calls" only for an EOS stop with at least one completed
    call (a truncated or malformed block has no completed calls).
    """
    if stop_reason == "stop" and completed_tool_calls > 0:
        return "tool_calls"
    return stop_reason
