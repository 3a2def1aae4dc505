"""One step's drafter calls: committed positions observed, proposals after every sampled token.

Only committed positions reach the drafter: a row's known tokens plus its accepted drafts (the
bonus token is the next anchor, not yet in any cache). Proposals are asked for rows that want them
(`num_proposals`), in one batched `propose` call.
"""
from __future__ import annotations

from typing import Optional

import torch

from services.worker.model.batch import StepBatch
from services.worker.model.drafter import Drafter, DraftRequest, StreamDrafter


def run_drafter(drafter: Drafter, chunks: list, batch: StepBatch, hidden: torch.Tensor,
                taps: Optional[torch.Tensor], out) -> None:
    """Observe every chunk's committed positions, then fill `out.proposals`."""
    requests: list[tuple[int, DraftRequest]] = []
    for i, (chunk, rows) in enumerate(zip(chunks, batch.chunks)):
        if out.errors[i]:
            continue
        committed = chunk.num_known + (out.num_accepted[i] if out.sampled[i] is not None else 0)
        first = rows.row_start
        _observe(drafter, chunk, committed, hidden[first:first + committed],
                 None if taps is None else taps[first:first + committed])
        if chunk.num_proposals and out.sampled[i] is not None:
            requests.append((i, DraftRequest(chunk.seq_id, out.sampled[i],
                                             chunk.start_pos + committed, chunk.num_proposals)))
    if requests:
        drafts = drafter.propose([request for _, request in requests])
        for (i, _), draft in zip(requests, drafts):
            out.proposals[i] = list(draft.tokens)


def _observe(drafter: Drafter, chunk, committed: int, streams: torch.Tensor,
             taps: Optional[torch.Tensor]) -> None:
    if isinstance(drafter, StreamDrafter):
        drafter.observe_streams(chunk.seq_id, chunk.start_pos, streams,
                                chunk.token_ids[:committed], chunk.block_tables)
    elif taps is not None:
        drafter.observe(chunk.seq_id, chunk.start_pos, taps)
