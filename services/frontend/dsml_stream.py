"""Incremental DeepSeek-V4 output parser: text deltas in, reasoning / content / tool-call deltas out.

One state machine serves both paths: `parse_completion` feeds the whole text at once, so a streamed
response and a non-streamed one of the same completion always agree.

Hold-back: text that may still turn into a marker (`</think>`, `"\\n\\n<｜DSML｜tool_calls"`, EOS or a
special token that is not allowed in text) is kept until it is decided, so no DSML or think tag ever
reaches a reasoning or content delta.

Tool calls stream as they parse: `ToolCallStart` once the invoke header is complete, then argument
fragments — the key when a parameter opens, a raw-string value escaped chunk by chunk, a JSON value
re-serialized whole when it closes — whose concatenation is exactly `json.dumps(arguments,
ensure_ascii=False)`. A call only counts as completed when the whole block closed and the output
ended on EOS (`StreamOutcome.tool_calls`). A truncated block (length stop) or a malformed one leaves
its streamed calls incomplete: `finish` records the error and `StreamOutcome.incomplete_tool_calls`
counts them, so the caller reports `finish_reason` "length"/"stop", never "tool_calls".
After an error nothing more is emitted: the rest of the output would break the format guarantees.
"""
from __future__ import annotations

import json
from enum import Enum, auto
from typing import Any, Callable, Optional

from services.frontend import dsv4_tokens as tok
from services.frontend.dsml_schema import ParameterTyping
from services.frontend.dsml_types import (
    CONTENT_AFTER_TOOL_CALLS, DUPLICATE_PARAMETER, FORMAT_ERROR, INVALID_JSON_VALUE, MISSING_EOS,
    MISSING_THINK_END, SPECIAL_TOKEN_IN_TEXT, TRUNCATED_TOOL_CALLS, ContentDelta, Delta,
    DsmlParseError, ParsedMessage, ParsedToolCall, ReasoningDelta, StreamOutcome,
    ToolCallArguments, ToolCallStart, new_tool_call_id)
from services.frontend.dsml_text import INVALID_JSON, held_back_start, merge_adjacent, strict_json

_FORBIDDEN_IN_TEXT = (tok.BOS, tok.THINK_START, tok.DSML)
_REASONING_STOPS = (tok.THINK_END, tok.TOOL_CALLS_START, tok.EOS, *_FORBIDDEN_IN_TEXT)
_CONTENT_STOPS = (tok.EOS, tok.TOOL_CALLS_START, tok.THINK_END, *_FORBIDDEN_IN_TEXT)
_INVOKE_OPEN = f'{tok.INVOKE_START} name="'
_PARAMETER_OPEN = f'{tok.PARAMETER_START} name="'
_MAX_NAME_CHARS = 1024


class _State(Enum):
    REASONING = auto()
    CONTENT = auto()
    BLOCK_OPEN = auto()         # after "\n\n<｜DSML｜tool_calls": expects ">\n"
    NEXT_INVOKE = auto()        # an invoke or the end of the block
    INVOKE_NAME = auto()
    INVOKE_HEADER_END = auto()
    FIRST_PARAMETER = auto()    # a parameter or the end of a zero-parameter invoke
    PARAMETER_NAME = auto()
    PARAMETER_FLAG = auto()
    PARAMETER_VALUE = auto()
    PARAMETER_CLOSE = auto()
    NEXT_PARAMETER = auto()
    AFTER_BLOCK = auto()        # only EOS may follow
    DONE = auto()
    FAILED = auto()


class _Call:
    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.index = index
        self.id = call_id
        self.name = name
        self.arguments: dict[str, Any] = {}
        self.parameter_names: list[str] = []


class StreamingParser:
    """One per generated sequence. `feed` text deltas, then `finish` once; read `outcome`."""

    def __init__(self, thinking: bool, tools: Optional[list[dict[str, Any]]] = None,
                 new_call_id: Callable[[], str] = new_tool_call_id) -> None:
        self._typing = ParameterTyping(tools)
        self._new_call_id = new_call_id
        self._state = _State.REASONING if thinking else _State.CONTENT
        self._buf = ""
        self._out: list[Delta] = []
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[_Call] = []
        self._invoke_name = ""
        self._param_name = ""
        self._param_is_string = False
        self._param_value: list[str] = []
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

    # --- driving ---------------------------------------------------------------------------------

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
                raise self._error_of(FORMAT_ERROR, "text after the end-of-sentence token")
            return False
        before = (self._state, len(self._buf))
        handler(self, at_end)
        return (self._state, len(self._buf)) != before

    def _check_end(self, stopped_on_eos: bool) -> None:
        state = self._state
        if state is _State.REASONING:
            self._fail(self._error_of(MISSING_THINK_END, "the output ended inside the reasoning"))
        elif state in (_State.CONTENT, _State.AFTER_BLOCK):
            if stopped_on_eos:
                self._state = _State.DONE
            else:
                self._fail(self._error_of(MISSING_EOS, "the output ended without EOS"))
        elif state is not _State.DONE:
            self._fail(self._error_of(TRUNCATED_TOOL_CALLS, "the tool-call block was not closed"))

    def _fail(self, error: DsmlParseError) -> None:
        if self._error is None:
            self._error = error
        self._state = _State.FAILED
        self._buf = ""

    def _error_of(self, code: str, message: str) -> DsmlParseError:
        return DsmlParseError(code, message, ParsedMessage(
            "".join(self._content), "".join(self._reasoning), []))

    def _build_outcome(self) -> StreamOutcome:
        if self._error is not None:
            return StreamOutcome(None, self._error, len(self._calls))
        calls = [ParsedToolCall(c.name, c.arguments, c.id) for c in self._calls]
        message = ParsedMessage("".join(self._content), "".join(self._reasoning), calls)
        return StreamOutcome(message, None, 0)

    def _take_deltas(self) -> list[Delta]:
        """The deltas produced since the last call, adjacent ones of one kind merged."""
        deltas, self._out = merge_adjacent(self._out), []
        return deltas

    # --- reasoning and content ----------------------------------------------------------------------

    def _on_reasoning(self, at_end: bool) -> None:
        stop = self._scan_text(_REASONING_STOPS, self._emit_reasoning, at_end)
        if stop == tok.THINK_END:
            self._state = _State.CONTENT
        elif stop == tok.TOOL_CALLS_START:  # a block ends the reasoning implicitly
            self._state = _State.BLOCK_OPEN
        elif stop == tok.EOS:
            raise self._error_of(MISSING_THINK_END, "EOS before </think>")
        elif stop is not None:
            raise self._error_of(SPECIAL_TOKEN_IN_TEXT, f"{stop!r} inside the reasoning")

    def _on_content(self, at_end: bool) -> None:
        stop = self._scan_text(_CONTENT_STOPS, self._emit_content, at_end)
        if stop == tok.EOS:
            self._state = _State.DONE
        elif stop == tok.TOOL_CALLS_START:
            self._state = _State.BLOCK_OPEN
        elif stop is not None:
            raise self._error_of(SPECIAL_TOKEN_IN_TEXT, f"{stop!r} inside the content")

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

    # --- the tool-call block ------------------------------------------------------------------------

    def _expect(self, options: tuple[str, ...]) -> Optional[str]:
        """Consume one of `options` at the head of the buffer; None while undecided."""
        buf = self._buf
        for option in options:
            if buf.startswith(option):
                self._buf = buf[len(option):]
                return option
        if any(option.startswith(buf) for option in (*options, tok.EOS)):
            return None
        if buf.startswith(tok.EOS):
            raise self._error_of(TRUNCATED_TOOL_CALLS, "EOS inside the tool-call block")
        raise self._error_of(FORMAT_ERROR, f"expected {' or '.join(map(repr, options))}, "
                                           f"got {buf[:40]!r}")

    def _read_name(self) -> Optional[str]:
        """A name up to its closing quote (consumed); None while the quote has not arrived."""
        end = self._buf.find('"')
        if tok.EOS in self._buf[: end if end != -1 else len(self._buf)]:
            raise self._error_of(TRUNCATED_TOOL_CALLS, "EOS inside the tool-call block")
        if end == -1:
            if len(self._buf) > _MAX_NAME_CHARS:
                raise self._error_of(FORMAT_ERROR, "unterminated name in the tool-call block")
            return None
        name = self._buf[:end]
        if not name or "\n" in name:
            raise self._error_of(FORMAT_ERROR, f"invalid name {name!r} in the tool-call block")
        self._buf = self._buf[end + 1:]
        return name

    def _on_block_open(self, at_end: bool) -> None:
        if self._expect((">\n",)):
            self._state = _State.NEXT_INVOKE

    def _on_next_invoke(self, at_end: bool) -> None:
        found = self._expect((_INVOKE_OPEN, tok.TOOL_CALLS_END))
        if found == _INVOKE_OPEN:
            self._state = _State.INVOKE_NAME
        elif found == tok.TOOL_CALLS_END:
            self._state = _State.AFTER_BLOCK

    def _on_invoke_name(self, at_end: bool) -> None:
        name = self._read_name()
        if name is not None:
            self._invoke_name = name
            self._state = _State.INVOKE_HEADER_END

    def _on_invoke_header_end(self, at_end: bool) -> None:
        if self._expect((">\n",)):
            call = _Call(len(self._calls), self._new_call_id(), self._invoke_name)
            self._calls.append(call)
            self._out.append(ToolCallStart(call.index, call.id, call.name))
            self._state = _State.FIRST_PARAMETER

    def _on_first_parameter(self, at_end: bool) -> None:
        # The encoder renders a zero-parameter invoke with a blank line; one newline is accepted too.
        found = self._expect((_PARAMETER_OPEN, _INVOKE_CLOSE, "\n" + _INVOKE_CLOSE))
        if found == _PARAMETER_OPEN:
            self._state = _State.PARAMETER_NAME
        elif found is not None:
            self._emit_arguments("{}")
            self._state = _State.NEXT_INVOKE

    def _on_next_parameter(self, at_end: bool) -> None:
        found = self._expect((_PARAMETER_OPEN, _INVOKE_CLOSE))
        if found == _PARAMETER_OPEN:
            self._state = _State.PARAMETER_NAME
        elif found is not None:
            self._emit_arguments("}")
            self._state = _State.NEXT_INVOKE

    def _on_parameter_name(self, at_end: bool) -> None:
        name = self._read_name()
        if name is not None:
            self._param_name = name
            self._state = _State.PARAMETER_FLAG

    def _on_parameter_flag(self, at_end: bool) -> None:
        found = self._expect((_FLAG_TRUE, _FLAG_FALSE))
        if found is None:
            return
        call, name = self._calls[-1], self._param_name
        if name in call.parameter_names:
            raise self._error_of(DUPLICATE_PARAMETER, f"parameter {name!r} repeats in {call.name!r}")
        self._param_is_string = self._typing.is_raw_string(call.name, name, found == _FLAG_TRUE)
        self._param_value = []
        separator = ", " if call.parameter_names else "{"
        call.parameter_names.append(name)
        quote = '"' if self._param_is_string else ""
        self._emit_arguments(f"{separator}{json.dumps(name, ensure_ascii=False)}: {quote}")
        self._state = _State.PARAMETER_VALUE

    def _on_parameter_value(self, at_end: bool) -> None:
        buf = self._buf
        end, eos = buf.find(tok.PARAMETER_END), buf.find(tok.EOS)
        if eos != -1 and (end == -1 or eos < end):
            raise self._error_of(TRUNCATED_TOOL_CALLS, "EOS inside a parameter value")
        if end != -1:
            self._add_value(buf[:end])
            self._buf = buf[end + len(tok.PARAMETER_END):]
            self._state = _State.PARAMETER_CLOSE
            return
        hold_at = len(buf) if at_end else held_back_start(buf, (tok.PARAMETER_END, tok.EOS))
        self._add_value(buf[:hold_at])
        self._buf = buf[hold_at:]

    def _on_parameter_close(self, at_end: bool) -> None:
        if self._expect((">\n",)) is None:
            return
        call, raw = self._calls[-1], "".join(self._param_value)
        if self._param_is_string:
            call.arguments[self._param_name] = raw
            self._emit_arguments('"')
        else:
            value = strict_json(raw)
            if value is INVALID_JSON:
                raise self._error_of(INVALID_JSON_VALUE,
                                     f"parameter {self._param_name!r} of {call.name!r} is not JSON")
            call.arguments[self._param_name] = value
            self._emit_arguments(json.dumps(value, ensure_ascii=False))
        self._state = _State.NEXT_PARAMETER

    def _add_value(self, text: str) -> None:
        if not text:
            return
        self._param_value.append(text)
        if self._param_is_string:
            self._emit_arguments(json.dumps(text, ensure_ascii=False)[1:-1])

    def _emit_arguments(self, fragment: str) -> None:
        self._out.append(ToolCallArguments(self._calls[-1].index, fragment))

    def _on_after_block(self, at_end: bool) -> None:
        if self._buf.startswith(tok.EOS):
            self._buf = self._buf[len(tok.EOS):]
            self._state = _State.DONE
        elif not tok.EOS.startswith(self._buf):
            raise self._error_of(CONTENT_AFTER_TOOL_CALLS,
                                 f"{self._buf[:40]!r} after the tool-call block")


_INVOKE_CLOSE = tok.INVOKE_END + "\n"
_FLAG_TRUE = ' string="true">'
_FLAG_FALSE = ' string="false">'

_HANDLERS: dict[_State, Callable[[StreamingParser, bool], None]] = {
    _State.REASONING: StreamingParser._on_reasoning,
    _State.CONTENT: StreamingParser._on_content,
    _State.BLOCK_OPEN: StreamingParser._on_block_open,
    _State.NEXT_INVOKE: StreamingParser._on_next_invoke,
    _State.INVOKE_NAME: StreamingParser._on_invoke_name,
    _State.INVOKE_HEADER_END: StreamingParser._on_invoke_header_end,
    _State.FIRST_PARAMETER: StreamingParser._on_first_parameter,
    _State.PARAMETER_NAME: StreamingParser._on_parameter_name,
    _State.PARAMETER_FLAG: StreamingParser._on_parameter_flag,
    _State.PARAMETER_VALUE: StreamingParser._on_parameter_value,
    _State.PARAMETER_CLOSE: StreamingParser._on_parameter_close,
    _State.NEXT_PARAMETER: StreamingParser._on_next_parameter,
    _State.AFTER_BLOCK: StreamingParser._on_after_block,
}
