"""Values produced by the DSML output parser (see `dsml_parser.py` for the rules)."""
from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Optional, Union

# Error codes of the dsml-parse conformance suite.
TRUNCATED_TOOL_CALLS = "truncated_tool_calls"
INVALID_JSON_VALUE = "invalid_json_value"
MISSING_THINK_END = "missing_think_end"
DUPLICATE_PARAMETER = "duplicate_parameter"
CONTENT_AFTER_TOOL_CALLS = "content_after_tool_calls"
SPECIAL_TOKEN_IN_TEXT = "special_token_in_text"
FORMAT_ERROR = "format_error"
MISSING_EOS = "missing_eos"

_CALL_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """`call_` + 24 random alphanumerics (the OpenAI shape)."""
    return "call_" + "".join(secrets.choice(_CALL_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: dict[str, Any]
    id: str

    @property
    def arguments_json(self) -> str:
        """The OpenAI `arguments` string; streamed fragments concatenate to exactly this."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ParsedMessage:
    content: str
    reasoning_content: str
    tool_calls: list[ParsedToolCall] = field(default_factory=list)


class DsmlParseError(Exception):
    """The completion does not follow the V4 output format.

    `partial` holds what was parsed before the problem (content and reasoning, never a tool call):
    a length-stopped completion fails with `missing_eos`, `missing_think_end` or
    `truncated_tool_calls`, and the caller may still show its text.
    """

    def __init__(self, code: str, message: str, partial: Optional[ParsedMessage] = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.partial = partial


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    index: int
    fragment: str


Delta = Union[ReasoningDelta, ContentDelta, ToolCallStart, ToolCallArguments]


@dataclass(frozen=True)
class StreamOutcome:
    """How a streamed completion ended, known after `StreamingParser.finish`.

    `tool_calls` holds the completed calls: only when the block closed and the output ended on EOS.
    `incomplete_tool_calls` counts calls whose `ToolCallStart` was streamed but that are not part of
    `tool_calls` (truncated or malformed block): the client must not treat them as invocations.
    """

    message: Optional[ParsedMessage]
    error: Optional[DsmlParseError]
    incomplete_tool_calls: int

    @property
    def tool_calls(self) -> list[ParsedToolCall]:
        return self.message.tool_calls if self.message else []
