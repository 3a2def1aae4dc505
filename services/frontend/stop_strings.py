"""Stop-string detection on streamed text, across token boundaries.

Text that could be the beginning of a stop string is held back until the next piece shows whether it
is one, so no byte of a stop string (or anything after it) ever reaches the client.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol


@dataclass(frozen=True)
class StopScan:
    text: str       # safe to emit now
    matched: bool   # a stop string was found; `text` ends right before it


class StopStringMatcher:
    def __init__(self, stop_strings: tuple[str, ...]) -> None:
        self._stops = stop_strings
        self._held = ""

    def feed(self, text: str) -> StopScan:
        """Scans `text` (appended to what is held back). Do not feed again after a match."""
        if not self._stops:
            return StopScan(text, False)
        buffer = self._held + text
        match_at = min((i for i in (buffer.find(s) for s in self._stops) if i >= 0), default=-1)
        if match_at >= 0:
            self._held = ""
            return StopScan(buffer[:match_at], True)
        keep = self._partial_match_length(buffer)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return StopScan(buffer[:len(buffer) - keep], False)

    def flush(self) -> str:
        """The held-back text, once generation ended without completing a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_match_length(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:length]):
                    longest = length
                    break
        return longest


class Detokenizer(Protocol):
    def feed(self, ids: Iterable[int]) -> str: ...
    def flush(self) -> str: ...


class StoppingDecoder:
    """Output ids → text the client may see: EOS removed, stop strings detected and cut."""

    def __init__(self, detokenizer: Detokenizer, eos_token_id: int, stop_strings: tuple[str, ...]) -> None:
        self._detokenizer = detokenizer
        self._eos_token_id = eos_token_id
        self._matcher = StopStringMatcher(stop_strings)

    def feed(self, token_ids: Iterable[int]) -> StopScan:
        text = self._detokenizer.feed(t for t in token_ids if t != self._eos_token_id)
        return self._matcher.feed(text)

    def finish(self) -> StopScan:
        """The rest of the text once generation ended; may still complete a stop string."""
        scan = self._matcher.feed(self._detokenizer.flush())
        return scan if scan.matched else StopScan(scan.text + self._matcher.flush(), False)
