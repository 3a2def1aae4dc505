"""One step's drafter calls: committed positions observed, proposals after every sampled token.

Only committed positions reach the drafter: a row's known tokens plus its accepted drafts (the
bonus token is the next anchor, not yet in any cache). Proposals are asked for rows that want them
(`num_proposals`), in one batched `propose` call that happens on every step, with no requests
when no row wants any: the ranks of an expert-parallel group must meet in the drafter's
collectives in the same steps (drafter.py).
"""
from __future__ import annotations

from typing import Optional

import torch

from services.worker.model.batch import StepBatch
from services.worker.model.drafter import Drafter, DraftRequest, StreamDrafter, StreamObservation


def run_drafter(drafter: Drafter, chunks: list, batch: StepBatch, hidden: torch.Tensor,
                taps: Optional[torch.Tensor], out) -> None:
    """Observe every chunk's committed positions, then fill `out.proposals`."""
    streaming = isinstance(drafter, StreamDrafter)
    observations: list[StreamObservation] = []
    requests: list[tuple[int, DraftRequest]] = []
    for i, (chunk, rows) in enumerate(zip(chunks, batch.chunks)):
        if out.errors[i]:
            continue
        committed = chunk.num_known + (out.num_accepted[i] if out.sampled[i] is not None else 0)
        first = rows.row_start
        if streaming:
            observations.append(StreamObservation(chunk.seq_id, chunk.start_pos,
                                                  hidden[first:first + committed],
                                                  chunk.token_ids[:committed],
                                                  chunk.block_tables))
        elif taps is not None:
            drafter.observe(chunk.seq_id, chunk.start_pos, taps[first:first + committed])
        if chunk.num_proposals and out.sampled[i] is not None:
            requests.append((i, DraftRequest(chunk.seq_id, out.sampled[i],
                                             chunk.start_pos + committed, chunk.num_proposals)))
    if streaming:
        drafter.observe_streams(observations)
    drafts = drafter.propose([request for _, request in requests])
    for (i, _), draft in zip(requests, drafts):
        out.proposals[i] = list(draft.tokens)
