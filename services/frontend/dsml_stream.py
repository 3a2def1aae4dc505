"""Incremental DeepSeek-V4 output parser: text deltas in, reasoning / content / tool-call deltas out.

One state machine serves both paths: `parse_completion` feeds the whole text at once, so a streamed
response and a non-streamed one of the same completion always agree.

Hold-back: text that may still turn into a marker (`</think>`, `"\\n\\n<｜DSML｜tool_calls"`, EOS or a
special token that is not allowed in text) is kept until it is decided, so no DSML or think tag ever
reaches a reasoning or content delta.

The tool-call block itself is parsed by `ToolCallBlockParser` (dsml_block.py), which streams the
calls as they parse. A call only counts as completed when the whole block closed and the output
ended on EOS (`StreamOutcome.tool_calls`). A truncated block (length stop) or a malformed one leaves
its streamed calls incomplete: `finish` records the error and `StreamOutcome.incomplete_tool_calls`
counts them, so the caller reports `finish_reason` "length"/"stop", never "tool_calls".
After an error nothing more is emitted: the rest of the output would break the format guarantees.
"""
from __future__ import annotations

from enum import Enum, auto
from typing import Any, Callable, Optional

from services.frontend import dsv4_tokens as tok
from services.frontend.dsml_block import ToolCallBlockParser
from services.frontend.dsml_text import held_back_start, merge_adjacent
from services.frontend.dsml_types import (
    CONTENT_AFTER_TOOL_CALLS, FORMAT_ERROR, MISSING_EOS, MISSING_THINK_END, SPECIAL_TOKEN_IN_TEXT,
    TRUNCATED_TOOL_CALLS, ContentDelta, Delta, DsmlParseError, ParsedMessage, ReasoningDelta,
    StreamOutcome, new_tool_call_id)

_FORBIDDEN_IN_TEXT = (tok.BOS, tok.THINK_START, tok.DSML)
_REASONING_STOPS = (tok.THINK_END, tok.TOOL_CALLS_START, tok.EOS, *_FORBIDDEN_IN_TEXT)
_CONTENT_STOPS = (tok.EOS, tok.TOOL_CALLS_START, tok.THINK_END, *_FORBIDDEN_IN_TEXT)


class _State(Enum):
    REASONING = auto()
    CONTENT = auto()
    TOOL_CALLS = auto()         # inside the block (ToolCallBlockParser)
    AFTER_BLOCK = auto()        # only EOS may follow
    DONE = auto()
    FAILED = auto()


class StreamingParser:
    """One per generated sequence. `feed` text deltas, then `finish` once; read `outcome`."""

    def __init__(self, thinking: bool, tools: Optional[list[dict[str, Any]]] = None,
                 new_call_id: Callable[[], str] = new_tool_call_id) -> None:
        self._state = _State.REASONING if thinking else _State.CONTENT
        self._buf = ""
        self._out: list[Delta] = []
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._block = ToolCallBlockParser(tools, new_call_id, self._out.append)
        self._outcome: Optional[StreamOutcome] = None
        self._error: Optional[DsmlParseError] = None

    @property
    def outcome(self) -> StreamOutcome:
        if self._outcome is None:
            raise RuntimeError("outcome is known only after finish()")
        return self._outcome

    def feed(self, text: str) -> list[Delta]:
        if self._outcome is not None:
            raise RuntimeError("feed() after finish()")
        if self._state is not _State.FAILED:
            self._buf += text
            self._run(at_end=False)
        return self._take_deltas()

    def finish(self, stopped_on_eos: bool) -> list[Delta]:
        """End of output. `stopped_on_eos`: the model emitted EOS (whether or not its text was fed)."""
        if self._outcome is not None:
            raise RuntimeError("finish() called twice")
        if self._state is not _State.FAILED:
            self._run(at_end=True)
        if self._state is not _State.FAILED:
            self._check_end(stopped_on_eos)
        self._outcome = self._build_outcome()
        return self._take_deltas()

    def _run(self, at_end: bool) -> None:
        try:
            while self._step(at_end):
                pass
        except DsmlParseError as error:
            self._fail(error)

    def _step(self, at_end: bool) -> bool:
        """Advance once; False when more text is needed (or the input is used up)."""
        handler = _HANDLERS.get(self._state)
        if handler is None:
            if self._buf and self._state is _State.DONE:
                raise DsmlParseError(FORMAT_ERROR, "text after the end-of-sentence token")
            return False
        before = (self._state, len(self._buf))
        handler(self, at_end)
        return (self._state, len(self._buf)) != before

    def _check_end(self, stopped_on_eos: bool) -> None:
        state = self._state
        if state is _State.REASONING:
            self._fail(DsmlParseError(MISSING_THINK_END, "the output ended inside the reasoning"))
        elif state in (_State.CONTENT, _State.AFTER_BLOCK):
            if stopped_on_eos:
                self._state = _State.DONE
            else:
                self._fail(DsmlParseError(MISSING_EOS, "the output ended without EOS"))
        elif state is not _State.DONE:
            self._fail(DsmlParseError(TRUNCATED_TOOL_CALLS, "the tool-call block was not closed"))

    def _fail(self, error: DsmlParseError) -> None:
        """The first error, with the content and reasoning parsed before it, ends the parse."""
        if self._error is None:
            self._error = DsmlParseError(error.code, error.message, ParsedMessage(
                "".join(self._content), "".join(self._reasoning), []))
        self._state = _State.FAILED
        self._buf = ""

    def _build_outcome(self) -> StreamOutcome:
        if self._error is not None:
            return StreamOutcome(None, self._error, self._block.calls_started)
        message = ParsedMessage("".join(self._content), "".join(self._reasoning),
                                self._block.calls())
        return StreamOutcome(message, None, 0)

    def _take_deltas(self) -> list[Delta]:
        """The deltas produced since the last call, adjacent ones of one kind merged."""
        deltas = merge_adjacent(self._out)
        self._out.clear()  # the block parser appends to this same list
        return deltas

    def _on_reasoning(self, at_end: bool) -> None:
        stop = self._scan_text(_REASONING_STOPS, self._emit_reasoning, at_end)
        if stop == tok.THINK_END:
            self._state = _State.CONTENT
        elif stop == tok.TOOL_CALLS_START:  # a block ends the reasoning implicitly
            self._state = _State.TOOL_CALLS
        elif stop == tok.EOS:
            raise DsmlParseError(MISSING_THINK_END, "EOS before </think>")
        elif stop is not None:
            raise DsmlParseError(SPECIAL_TOKEN_IN_TEXT, f"{stop!r} inside the reasoning")

    def _on_content(self, at_end: bool) -> None:
        stop = self._scan_text(_CONTENT_STOPS, self._emit_content, at_end)
        if stop == tok.EOS:
            self._state = _State.DONE
        elif stop == tok.TOOL_CALLS_START:
            self._state = _State.TOOL_CALLS
        elif stop is not None:
            raise DsmlParseError(SPECIAL_TOKEN_IN_TEXT, f"{stop!r} inside the content")

    def _on_tool_calls(self, at_end: bool) -> None:
        self._buf = self._block.advance(self._buf, at_end)
        if self._block.closed:
            self._state = _State.AFTER_BLOCK

    def _on_after_block(self, at_end: bool) -> None:
        if self._buf.startswith(tok.EOS):
            self._buf = self._buf[len(tok.EOS):]
            self._state = _State.DONE
        elif not tok.EOS.startswith(self._buf):
            raise DsmlParseError(CONTENT_AFTER_TOOL_CALLS,
                                 f"{self._buf[:40]!r} after the tool-call block")

    def _emit_reasoning(self, text: str) -> None:
        self._reasoning.append(text)
        self._out.append(ReasoningDelta(text))

    def _emit_content(self, text: str) -> None:
        self._content.append(text)
        self._out.append(ContentDelta(text))

    def _scan_text(self, stops: tuple[str, ...], emit: Callable[[str], None],
                   at_end: bool) -> Optional[str]:
        """Emit text up to the first stop (returned, consumed) or up to what must be held back."""
        buf = self._buf
        match_at, match = len(buf), None
        for stop in stops:
            at = buf.find(stop)
            if at != -1 and at < match_at:
                match_at, match = at, stop
        hold_at = len(buf) if at_end else held_back_start(buf, stops)
        if match is not None and match_at < hold_at:
            self._consume_text(match_at, emit)
            self._buf = self._buf[len(match):]
            return match
        self._consume_text(min(hold_at, match_at), emit)
        return None

    def _consume_text(self, length: int, emit: Callable[[str], None]) -> None:
        if length:
            emit(self._buf[:length])
            self._buf = self._buf[length:]


_HANDLERS: dict[_State, Callable[[StreamingParser, bool], None]] = {
    _State.REASONING: StreamingParser._on_reasoning,
    _State.CONTENT: StreamingParser._on_content,
    _State.TOOL_CALLS: StreamingParser._on_tool_calls,
    _State.AFTER_BLOCK: StreamingParser._on_after_block,
}
