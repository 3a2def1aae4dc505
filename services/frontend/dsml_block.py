"""The tool-call block of a V4 completion, parsed incrementally: invokes, parameters, values.

`ToolCallBlockParser` takes over after `"\\n\\n<｜DSML｜tool_calls"` (the streaming parser,
dsml_stream.py, finds that marker) and stops after the block's end marker. Calls stream as they
parse: `ToolCallStart` once the invoke header is complete, then argument fragments — the key when a
parameter opens, a raw-string value escaped chunk by chunk, a JSON value re-serialized whole when
it closes — whose concatenation is exactly `json.dumps(arguments, ensure_ascii=False)`.
Format errors raise `DsmlParseError` without `partial`: the streaming parser adds the text it
parsed before the block.
"""
from __future__ import annotations

import json
from enum import Enum, auto
from typing import Any, Callable, Optional

from services.frontend import dsv4_tokens as tok
from services.frontend.dsml_schema import ParameterTyping
from services.frontend.dsml_text import INVALID_JSON, held_back_start, strict_json
from services.frontend.dsml_types import (
    DUPLICATE_PARAMETER, FORMAT_ERROR, INVALID_JSON_VALUE, TRUNCATED_TOOL_CALLS, Delta,
    DsmlParseError, ParsedToolCall, ToolCallArguments, ToolCallStart)

_INVOKE_OPEN = f'{tok.INVOKE_START} name="'
_INVOKE_CLOSE = tok.INVOKE_END + "\n"
_PARAMETER_OPEN = f'{tok.PARAMETER_START} name="'
_FLAG_TRUE = ' string="true">'
_FLAG_FALSE = ' string="false">'
_MAX_NAME_CHARS = 1024


class _State(Enum):
    OPEN = auto()               # after "\n\n<｜DSML｜tool_calls": expects ">\n"
    NEXT_INVOKE = auto()        # an invoke or the end of the block
    INVOKE_NAME = auto()
    INVOKE_HEADER_END = auto()
    FIRST_PARAMETER = auto()    # a parameter or the end of a zero-parameter invoke
    PARAMETER_NAME = auto()
    PARAMETER_FLAG = auto()
    PARAMETER_VALUE = auto()
    PARAMETER_CLOSE = auto()
    NEXT_PARAMETER = auto()
    CLOSED = auto()             # the end marker was consumed


class _Call:
    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.index = index
        self.id = call_id
        self.name = name
        self.arguments: dict[str, Any] = {}
        self.parameter_names: list[str] = []


class ToolCallBlockParser:
    """One per completion. `advance` with the text after the block marker, as it arrives; the
    deltas go to `emit` in order."""

    def __init__(self, tools: Optional[list[dict[str, Any]]], new_call_id: Callable[[], str],
                 emit: Callable[[Delta], None]) -> None:
        self._typing = ParameterTyping(tools)
        self._new_call_id = new_call_id
        self._emit = emit
        self._state = _State.OPEN
        self._buf = ""
        self._calls: list[_Call] = []
        self._invoke_name = ""
        self._param_name = ""
        self._param_is_string = False
        self._param_value: list[str] = []

    @property
    def closed(self) -> bool:
        return self._state is _State.CLOSED

    @property
    def calls_started(self) -> int:
        """Calls whose `ToolCallStart` was emitted."""
        return len(self._calls)

    def calls(self) -> list[ParsedToolCall]:
        return [ParsedToolCall(c.name, c.arguments, c.id) for c in self._calls]

    def advance(self, text: str, at_end: bool) -> str:
        """Parse what `text` decides; returns the rest, held back until more text arrives (or
        following the end marker once `closed`). Raises `DsmlParseError` on a format error."""
        self._buf = text
        while not self.closed:
            before = (self._state, len(self._buf))
            _HANDLERS[self._state](self, at_end)
            if (self._state, len(self._buf)) == before:
                break
        rest, self._buf = self._buf, ""
        return rest

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
            raise DsmlParseError(TRUNCATED_TOOL_CALLS, "EOS inside the tool-call block")
        raise DsmlParseError(FORMAT_ERROR, f"expected {' or '.join(map(repr, options))}, "
                                           f"got {buf[:40]!r}")

    def _read_name(self) -> Optional[str]:
        """A name up to its closing quote (consumed); None while the quote has not arrived."""
        end = self._buf.find('"')
        if tok.EOS in self._buf[: end if end != -1 else len(self._buf)]:
            raise DsmlParseError(TRUNCATED_TOOL_CALLS, "EOS inside the tool-call block")
        if end == -1:
            if len(self._buf) > _MAX_NAME_CHARS:
                raise DsmlParseError(FORMAT_ERROR, "unterminated name in the tool-call block")
            return None
        name = self._buf[:end]
        if not name or "\n" in name:
            raise DsmlParseError(FORMAT_ERROR, f"invalid name {name!r} in the tool-call block")
        self._buf = self._buf[end + 1:]
        return name

    def _on_open(self, at_end: bool) -> None:
        if self._expect((">\n",)):
            self._state = _State.NEXT_INVOKE

    def _on_next_invoke(self, at_end: bool) -> None:
        found = self._expect((_INVOKE_OPEN, tok.TOOL_CALLS_END))
        if found == _INVOKE_OPEN:
            self._state = _State.INVOKE_NAME
        elif found == tok.TOOL_CALLS_END:
            self._state = _State.CLOSED

    def _on_invoke_name(self, at_end: bool) -> None:
        name = self._read_name()
        if name is not None:
            self._invoke_name = name
            self._state = _State.INVOKE_HEADER_END

    def _on_invoke_header_end(self, at_end: bool) -> None:
        if self._expect((">\n",)):
            call = _Call(len(self._calls), self._new_call_id(), self._invoke_name)
            self._calls.append(call)
            self._emit(ToolCallStart(call.index, call.id, call.name))
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
            raise DsmlParseError(DUPLICATE_PARAMETER, f"parameter {name!r} repeats in {call.name!r}")
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
            raise DsmlParseError(TRUNCATED_TOOL_CALLS, "EOS inside a parameter value")
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
                raise DsmlParseError(INVALID_JSON_VALUE,
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
        self._emit(ToolCallArguments(self._calls[-1].index, fragment))


_HANDLERS: dict[_State, Callable[[ToolCallBlockParser, bool], None]] = {
    _State.OPEN: ToolCallBlockParser._on_open,
    _State.NEXT_INVOKE: ToolCallBlockParser._on_next_invoke,
    _State.INVOKE_NAME: ToolCallBlockParser._on_invoke_name,
    _State.INVOKE_HEADER_END: ToolCallBlockParser._on_invoke_header_end,
    _State.FIRST_PARAMETER: ToolCallBlockParser._on_first_parameter,
    _State.PARAMETER_NAME: ToolCallBlockParser._on_parameter_name,
    _State.PARAMETER_FLAG: ToolCallBlockParser._on_parameter_flag,
    _State.PARAMETER_VALUE: ToolCallBlockParser._on_parameter_value,
    _State.PARAMETER_CLOSE: ToolCallBlockParser._on_parameter_close,
    _State.NEXT_PARAMETER: ToolCallBlockParser._on_next_parameter,
}
