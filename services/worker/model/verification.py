"""Verifying a row's speculative tokens: greedy masked argmax at every sampled position, longest
agreeing prefix accepted, plus the bonus token after it.

A verify row is the sequence's known tokens followed by draft tokens d_0..d_{n-1}; offset i is the
row's last known position + i, so draft i sits at offset i+1 and is predicted at offset i. A
grammar-forced draft is accepted iff every draft before it is (greedy decoding would have committed
it without sampling), so the target samples only at offsets whose next token is drafted, and at
the last offset. The first draft is never forced: the scheduler commits a forced run after its
newest sampled token as known tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

# (allowed_token_ids, token_bitmask) of one sampled position (both None: unconstrained).
PositionMask = tuple[Optional[torch.Tensor], Optional[torch.Tensor]]


@dataclass(frozen=True)
class Verdict:
    num_accepted: int   # leading draft tokens accepted (forced ones included)
    bonus_token: int    # the target's token after them


def sampled_offsets(num_drafts: int, forced: list[bool]) -> list[int]:
    """Offsets 0..num_drafts where the target samples: before each drafted token, and the last."""
    return [i for i in range(num_drafts + 1) if i == num_drafts or not forced[i]]


def verify(drafts: list[int], forced: list[bool], sample_at: Callable[[int], int]) -> Verdict:
    """`sample_at(offset)` → the target's masked greedy token there (called for sampled offsets
    only, in increasing order, and not past the first rejection)."""
    accepted = 0
    for i, token in enumerate(drafts):
        if not forced[i] and sample_at(i) != token:
            break
        accepted += 1
    return Verdict(accepted, sample_at(accepted))
