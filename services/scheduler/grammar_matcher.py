"""One request's XGrammar matcher: masks in their smallest form, accepted and forced tokens,
rollback, and the raw-string length guard lifted out of its grammar."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Optional

import numpy as np
from tokenizers import Tokenizer

from services.scheduler.raw_string_guard import LengthGuard

# A mask with at most this many allowed tokens travels as an id list of them, one with at most this
# many refused tokens as an id list of those, otherwise as the bitmask.
# Measured with bench/bench_grammar.py (V = 129,280; shared 2-core machine, best of 30):
#   serialized TokenMask: ids ~2.9 B each (1024 ids: 2,972 B; 4096: 11,724 B) vs 16,163 B always;
#   scheduler cost: ids ~40 µs + ~0.16 µs/id (4096 ids: 0.7 ms) vs ~5 µs for the bitmask bytes;
#   worker cost on CPU: applying a bitmask row ~1.75 ms (xgrammar-notes) vs a scatter of the ids.
# Bytes break even near 5,500 ids and the end-to-end time near 6,000, so 4096 keeps every case
# where the list wins. Real positions are bimodal anyway: structure/enum/number positions allow
# <= 14 tokens, free text (reasoning, raw strings) >= 129,000: a tool-calling free-text position
# refuses 3 tokens, so its mask is ~10 B instead of 16,163 B (bench/bench_mask_path.py: a batch-32
# StepRequest of free-text rows went from 517,764 B to 836 B).
SHORT_MASK_MAX_IDS = 4096


@dataclass(frozen=True)
class MaskRow:
    """The tokens allowed at one position: exactly one of the three forms is set."""

    num_allowed: int
    allowed_token_ids: Optional[list[int]] = None   # ascending
    bitmask: Optional[bytes] = None                 # ceil(V/32) int32 words, little-endian
    refused_token_ids: Optional[list[int]] = None   # ascending, at least one


class RequestMatcher:
    """One request's grammar state. Not thread-safe: the step loop owns it.

    `guard` enforces the raw-string length limits lifted out of the grammar: it narrows every
    mask, refuses what it would have masked, and rolls back with the matcher.
    """

    def __init__(self, xgr: ModuleType, compiled: Any, tokenizer: Tokenizer, vocab_size: int,
                 eos_token_id: int, on_release: Callable[[], None],
                 guard: Optional[LengthGuard] = None) -> None:
        self._matcher = xgr.GrammarMatcher(compiled)
        self._guard = guard
        # Allowed-token count of the bitmask buffer while it holds the current position's mask:
        # the fill at the end of `forced_tokens` is the next step's mask (one XGrammar fill per
        # row and step instead of two).
        self._filled_count: Optional[int] = None
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_token_id = eos_token_id
        self._on_release: Optional[Callable[[], None]] = on_release

    def mask(self) -> MaskRow:
        """The next position's mask in its smallest form (SHORT_MASK_MAX_IDS)."""
        count = self._fill_mask()
        if count <= SHORT_MASK_MAX_IDS:
            return MaskRow(count, allowed_token_ids=self._set_bits(self._words()).tolist())
        if count >= self._vocab_size - SHORT_MASK_MAX_IDS:
            refused = self._set_bits(~self._words())
            if refused.size:   # none refused: an empty list would read as "allows nothing"
                return MaskRow(count, refused_token_ids=refused.tolist())
        return MaskRow(count, bitmask=self._bitmask.numpy().astype("<i4", copy=False).tobytes())

    def accept(self, token_id: int) -> bool:
        if self._guard is not None and not self._guard.allows(token_id):
            return False
        if not self._matcher.accept_token(token_id):
            return False
        self._filled_count = None
        if self._guard is not None:
            self._guard.advance(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        """Undoes the last `num_tokens` accepted tokens (forced ones included); with a length
        guard at most its MAX_ROLLBACK_TOKENS (checked before anything changes)."""
        if self._guard is not None:
            self._guard.rollback(num_tokens)
        self._matcher.rollback(num_tokens)
        self._filled_count = None

    def forced_tokens(self, limit: int) -> list[int]:
        """Tokens the grammar forces next, already accepted (EOS is never forced).

        A position with a single allowed token is forced. Otherwise XGrammar's jump-forward string
        (the text every continuation starts with) is tokenized with the real tokenizer and accepted
        token by token; its last token is left to the model, since it might merge with what
        follows, and nothing the matcher refuses is ever taken.
        """
        forced: list[int] = []
        while len(forced) < limit and not self._matcher.is_terminated():
            if self._fill_mask() == 1:
                token = int(self._set_bits(self._words())[0])
                if token == self._eos_token_id or not self.accept(token):
                    break
                forced.append(token)
            elif not self._accept_jump_forward(forced, limit):
                break
        return forced

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def release(self) -> None:
        if self._on_release is None:
            return
        self._on_release()
        self._on_release = None
        self._matcher = None
        self._bitmask = None

    def _accept_jump_forward(self, forced: list[int], limit: int) -> bool:
        text = self._matcher.find_jump_forward_string()
        if not text:
            return False
        candidates = self._tokenizer.encode(text, add_special_tokens=False).ids[:-1]
        taken = 0
        for token in candidates:
            if len(forced) >= limit or not self.accept(token):
                break
            forced.append(token)
            taken += 1
        return taken > 0

    def _fill_mask(self) -> int:
        """Fills the bitmask buffer for the next position; returns the number of allowed tokens."""
        if self._filled_count is None:
            self._matcher.fill_next_token_bitmask(self._bitmask)
            if self._guard is not None:
                self._guard.restrict(self._words())
            self._filled_count = int(np.bitwise_count(self._words()).sum())
        return self._filled_count

    def _set_bits(self, words: np.ndarray) -> np.ndarray:
        """Token ids (ascending, within the vocabulary) of the bits set in `words` (the filled
        bitmask: the allowed ids; its complement: the refused ones)."""
        nonzero = np.flatnonzero(words)
        bits = np.unpackbits(words[nonzero].view(np.uint8), bitorder="little").reshape(-1, 32)
        ids = (nonzero[:, None] * 32 + np.arange(32))[bits.astype(bool)]
        return ids[ids < self._vocab_size]

    def _words(self) -> np.ndarray:
        return self._bitmask.numpy().view(np.uint32)[0]
