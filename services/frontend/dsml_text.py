"""Small text helpers of the streaming DSML parser."""
from __future__ import annotations

from typing import Any

from services.frontend.dsml_types import (
    ContentDelta, Delta, ReasoningDelta, ToolCallArguments)
from services.frontend.json_standard import loads_standard

INVALID_JSON = object()


def held_back_start(text: str, patterns: tuple[str, ...]) -> int:
    """Where the longest tail of `text` that is a proper prefix of some pattern begins."""
    start = len(text)
    for pattern in patterns:
        for length in range(min(len(pattern) - 1, len(text)), 0, -1):
            if length <= len(text) - start:
                break
            if text.endswith(pattern[:length]):
                start = len(text) - length
                break
    return start


def strict_json(text: str) -> Any:
    """`json.loads` minus Python's extensions (NaN, Infinity) that no JSON client can read;
    `INVALID_JSON` when the text is not one JSON value (surrounding whitespace allowed)."""
    try:
        return loads_standard(text)
    except (ValueError, RecursionError):   # too deep for the parser counts as not parseable
        return INVALID_JSON


def merge_adjacent(deltas: list[Delta]) -> list[Delta]:
    """Fewer, larger deltas: neighbours of one kind (and one call) are joined."""
    merged: list[Delta] = []
    for delta in deltas:
        last = merged[-1] if merged else None
        if isinstance(delta, ReasoningDelta) and isinstance(last, ReasoningDelta):
            merged[-1] = ReasoningDelta(last.text + delta.text)
        elif isinstance(delta, ContentDelta) and isinstance(last, ContentDelta):
            merged[-1] = ContentDelta(last.text + delta.text)
        elif (isinstance(delta, ToolCallArguments) and isinstance(last, ToolCallArguments)
              and last.index == delta.index):
            merged[-1] = ToolCallArguments(delta.index, last.fragment + delta.fragment)
        else:
            merged.append(delta)
    return merged
