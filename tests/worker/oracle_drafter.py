"""A test-only drafter that knows the target's continuation (never reachable from the CLI).

It proposes the tokens a K=0 greedy run produced at the positions after the anchor, optionally
corrupted at one draft index, so tests get full and partial acceptance deterministically.
"""
from __future__ import annotations

from typing import Optional

import torch

from services.worker.model.drafter import Draft, DraftRequest


class OracleDrafter:
    tap_layer_ids: tuple[int, ...] = ()

    def __init__(self, tokens_by_seq: dict[int, list[int]], corrupt_at: Optional[int] = None,
                 vocab_size: int = 129280) -> None:
        self.tokens_by_seq = tokens_by_seq  # seq id → its K=0 tokens by position
        self.corrupt_at = corrupt_at
        self.vocab_size = vocab_size
        self.released: list[int] = []

    def observe(self, seq_id: int, start_pos: int, taps: torch.Tensor) -> None:
        pass

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        return [self._draft(r) for r in requests]

    def release(self, seq_id: int) -> None:
        self.released.append(seq_id)

    def _draft(self, request: DraftRequest) -> Draft:
        known = self.tokens_by_seq.get(request.seq_id, [])
        first = request.anchor_pos + 1
        tokens = [known[p] if p < len(known) else 0 for p in range(first, first + request.num_drafts)]
        if self.corrupt_at is not None and self.corrupt_at < len(tokens):
            tokens[self.corrupt_at] = (tokens[self.corrupt_at] + 1) % self.vocab_size
        return Draft(tokens, [1.0] * len(tokens))
