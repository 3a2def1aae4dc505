"""Enforces the raw-string length limits that raw_string_lift.py took out of a grammar.

`TokenTexts` (one per grammar service) holds every token's bytes as XGrammar decodes them and the
bitmask tables the guard masks with. `LengthGuard` (one per request) follows the accepted text: in
markup it watches for an invoke header and for the begin of a limited parameter; inside a limited
value it counts code points up to the closing `</｜DSML｜` exactly as XGrammar 0.2.7's `max_chars`
does: the bytes that are not UTF-8 continuation bytes, with one token-level rule of its own — a token
whose first byte is a continuation byte needs at least one character left, counting a pending tail
as value (so a character split across tokens cannot be completed once its lead byte took the last
character; when such a token only extends a pending `</｜…`, only the closing tag may follow). tests/scheduler/
test_raw_string_limits.py checks both against XGrammar's `max_chars` token by token and mask by mask. The value can never contain that text (its excludes hold `｜DSML｜`), so the value ends
at its first occurrence; a value whose tail could still become it (`<`, `</`, ...) keeps that tail
pending until the next token decides.

A token that ends a limited parameter's begin and goes on into its value is checked against the
fresh limit while still in markup (`>();` after `string="true"`).

A token is allowed inside a limited value when its value part fits what is left: the code points
before the closing tag starts in pending + token (or, when it may start at the token's last `<`,
before that `<`). Continuing the closing tag is always allowed, so a value can always be closed.
"""
from __future__ import annotations

import re
import threading
from collections import deque
from typing import Iterator, Optional, Sequence

import numpy as np

from services.scheduler.raw_string_lift import DSML, LimitKey

CLOSE_START = f"</{DSML}".encode()
INVOKE_PREFIX = f'<{DSML}invoke name="'.encode()
# States kept for rollback (speculative drafts roll back a few tokens): a bounded history keeps a long
# output's guard small.
MAX_ROLLBACK_TOKENS = 1024
INVOKE_HEAD_AT_END = re.compile(re.escape(INVOKE_PREFIX) + rb'([^"]*)">\Z')


def count_chars(data: bytes) -> int:
    """Code points in UTF-8 `data`: the bytes that are not continuation bytes."""
    return len(data) - sum(1 for byte in data if byte & 0xC0 == 0x80)


def starts_continued(data: bytes) -> bool:
    """Does `data` start with a UTF-8 continuation byte?"""
    return bool(data) and data[0] & 0xC0 == 0x80


def split_value(data: bytes) -> tuple[int, bool]:
    """(where the value part of `data` ends, whether the closing tag starts there for sure).

    Not for sure: `data[cut:]` is a proper prefix of `</｜DSML｜`, which the next bytes confirm or
    turn into value text. `data` is what follows the value's start or pending tail.
    """
    at = data.find(CLOSE_START)
    if at >= 0:
        return at, True
    last = data.rfind(b"<")   # `</｜DSML｜` holds one `<`: only the last one can start it
    if last >= 0 and CLOSE_START.startswith(data[last:]):
        return last, False
    return len(data), False


def fresh_value_fits(data: bytes, limit: int) -> bool:
    """May a value with `limit` code points start with `data` (XGrammar's rule included)?"""
    if starts_continued(data) and limit < 1:
        return False
    return count_chars(data[:split_value(data)[0]]) <= limit


class TokenTexts:
    """Each token's bytes, its value part's length, and bitmask tables built on demand."""

    def __init__(self, decoded_vocab: Sequence[bytes], vocab_size: int) -> None:
        self.texts = [bytes(text) for text in decoded_vocab][:vocab_size]
        self.texts += [b""] * (vocab_size - len(self.texts))
        self.num_words = (vocab_size + 31) // 32
        values = [text[:split_value(text)[0]] for text in self.texts]
        self.value_chars = np.array([count_chars(value) for value in values], dtype=np.int32)
        self.continued = np.array([starts_continued(value) for value in values], dtype=bool)
        self.longest = int(self.value_chars.max(initial=0))
        self._by_first_byte: dict[int, list[int]] = {}
        for token_id, text in enumerate(self.texts):
            self._by_first_byte.setdefault(text[0] if text else -1, []).append(token_id)
        self._fits: dict[int, np.ndarray] = {}
        self._continues: dict[bytes, np.ndarray] = {}
        self._overflows: dict[tuple[bytes, int], Optional[np.ndarray]] = {}
        self._lock = threading.Lock()

    def fits(self, budget: int) -> np.ndarray:
        """uint32 words: the tokens a value with `budget` code points left may take."""
        with self._lock:
            if budget not in self._fits:
                allowed = self.value_chars <= budget
                self._fits[budget] = self._words(allowed if budget > 0 else
                                                 allowed & ~self.continued)
            return self._fits[budget]

    def continues(self, pending: bytes) -> np.ndarray:
        """uint32 words: the tokens that carry `pending` on as the closing tag."""
        with self._lock:
            if pending not in self._continues:
                carry = np.zeros(len(self.texts), dtype=bool)
                candidates = (self._by_first_byte.get(CLOSE_START[len(pending)], [])
                              + self._by_first_byte.get(-1, []))
                for token_id in candidates:
                    carry[token_id] = _continues_close(pending + self.texts[token_id])
                self._continues[pending] = self._words(carry)
            return self._continues[pending]

    def overflows(self, rest: bytes, limit: int) -> Optional[np.ndarray]:
        """uint32 words: the tokens that finish a begin with `rest` and overflow its value's
        `limit`; None when there are none."""
        key = (rest, limit)
        with self._lock:
            if key not in self._overflows:
                refused = [token_id for token_id in self._by_first_byte.get(rest[0], [])
                           if len(text := self.texts[token_id]) > len(rest)
                           and text.startswith(rest)
                           and not fresh_value_fits(text[len(rest):], limit)]
                flags = np.zeros(len(self.texts), dtype=bool)
                flags[refused] = True
                self._overflows[key] = self._words(flags) if refused else None
            return self._overflows[key]

    def _words(self, allowed: np.ndarray) -> np.ndarray:
        packed = np.packbits(allowed, bitorder="little")
        words = np.zeros(self.num_words * 4, dtype=np.uint8)
        words[:packed.size] = packed
        return words.view("<u4")


def _continues_close(data: bytes) -> bool:
    return data.startswith(CLOSE_START) or CLOSE_START.startswith(data)


class LengthGuard:
    """One request's view of its limited raw-string values. Not thread-safe (the step loop's)."""

    def __init__(self, max_chars: dict[LimitKey, int], invoke_names: frozenset[str],
                 texts: TokenTexts) -> None:
        self._texts = texts
        self._limits: dict[Optional[bytes], list[tuple[bytes, int]]] = {}
        for (tool, begin), limit in max_chars.items():
            self._limits.setdefault(tool.encode(), []).append((begin.encode(), limit))
        longest_head = max((len(name.encode()) for name in invoke_names), default=0)
        self._tail_bytes = max([len(INVOKE_PREFIX) + longest_head + 2] +
                               [len(begin) for begins in self._limits.values()
                                for begin, _ in begins])
        self._tail = b""                 # the latest markup bytes
        self._tool: Optional[bytes] = None
        self._left: Optional[int] = None  # code points the open value may still take
        self._pending = b""
        self._close_only = False           # XGrammar's rule left only the closing tag possible
        # The state before each of the latest advances, for rollback.
        self._history: deque[tuple] = deque(maxlen=MAX_ROLLBACK_TOKENS)

    def allows(self, token_id: int) -> bool:
        if not 0 <= token_id < len(self._texts.texts):
            return self._left is None
        text = self._texts.texts[token_id]
        if self._left is None:
            return all(not text.startswith(rest) or fresh_value_fits(text[len(rest):], limit)
                       for rest, limit in self._entering())
        data = self._pending + text
        if self._pending and _continues_close(data):
            return True
        if self._close_only or (starts_continued(text) and self._value_left() < 1):
            return False
        return count_chars(data[:split_value(data)[0]]) <= self._left

    def restrict(self, words: np.ndarray) -> None:
        """ANDs the budget into a filled bitmask (uint32 words): inside a limited value, or in
        markup for the tokens that would enter one."""
        if self._left is None:
            for rest, limit in self._entering():
                overflow = self._texts.overflows(rest, limit)
                if overflow is not None:
                    np.bitwise_and(words, ~overflow, out=words)
            return
        budget = self._value_left()
        if budget >= self._texts.longest and not self._close_only:
            return
        allowed = self._texts.fits(budget) if budget >= 0 and not self._close_only else 0
        if self._pending:
            allowed = allowed | self._texts.continues(self._pending)
        np.bitwise_and(words, allowed, out=words)

    def advance(self, token_id: int) -> None:
        """Follows an accepted token's text."""
        self._history.append((self._tail, self._tool, self._left, self._pending,
                              self._close_only))
        data = self._texts.texts[token_id]
        while data:
            data = self._markup(data) if self._left is None else self._value(data)

    def rollback(self, num_tokens: int) -> None:
        """Returns to the state before the last `num_tokens` advances (as the matcher does)."""
        if not 0 <= num_tokens <= len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} of {len(self._history)} tokens")
        for _ in range(num_tokens):
            state = self._history.pop()
        if num_tokens:
            self._tail, self._tool, self._left, self._pending, self._close_only = state

    def _entering(self) -> Iterator[tuple[bytes, int]]:
        """(the rest of a limited begin, its limit) for each begin the markup may be inside."""
        for begin, limit in self._limits.get(self._tool, ()):
            for done in range(len(begin)):
                if self._tail.endswith(begin[:done]):
                    yield begin[done:], limit

    def _value_left(self) -> int:
        """Code points left if the pending tail turns out to be value text."""
        return self._left - count_chars(self._pending)

    def _value(self, data: bytes) -> bytes:
        if starts_continued(data) and self._value_left() < 1:
            self._close_only = True
        data = self._pending + data
        cut, closed = split_value(data)
        self._left -= count_chars(data[:cut])
        if not closed:
            self._pending = data[cut:]
            return b""
        self._left, self._pending, self._close_only = None, b"", False
        return data[cut + len(CLOSE_START):]

    def _markup(self, data: bytes) -> bytes:
        """Scans markup up to a limited parameter's begin; returns the bytes after it."""
        start = 0
        while (end := data.find(b">", start)) >= 0:
            self._tail = (self._tail + data[start:end + 1])[-self._tail_bytes:]
            start = end + 1
            head = INVOKE_HEAD_AT_END.search(self._tail)
            if head is not None:
                self._tool = head.group(1)
                continue
            for begin, limit in self._limits.get(self._tool, ()):
                if self._tail.endswith(begin):
                    self._left, self._pending = limit, b""
                    return data[start:]
        self._tail = (self._tail + data[start:])[-self._tail_bytes:]
        return b""
