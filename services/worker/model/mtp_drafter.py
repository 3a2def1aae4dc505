"""`MtpDrafter`: speculation with the checkpoint's MTP block (`{"method":"mtp"}`).

The MTP block at position t reads the target's last-layer streams h_t and the token at t+1, and
its head guesses the token at t+2. After a step committed positions ..q and sampled the bonus b
(position q+1), the block at q with (h_q, b) proposes d_1 for q+2; further proposals chain the
block on its own output streams (position q+1 with d_1, ...), as vLLM and SGLang do with one MTP
layer.

Its attention cache is paged like the target's: a `PagedKvCache` of the MTP layer addressed by
the sequence's own block tables (the scheduler allocates K positions past each window for the
chain). Rows are written for committed positions as they are observed; chained rows past the
committed length are rewritten by the next observation before anything reads them (the same
write-before-read the target's caches rely on). Per sequence it keeps only the newest committed
position's stream, whose next token is not known yet, and the tables; `release` drops both.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.model.batch import build_batch
from services.worker.model.drafter import Draft, DraftRequest, StreamObservation
from services.worker.model.kv_cache import PagedKvCache
from services.worker.model.transformer import DeepseekV4


@dataclass
class _Pending:
    position: int
    stream: torch.Tensor               # [hc, D]: the target's streams at `position`
    block_tables: dict[str, list[int]]


class MtpDrafter:
    """Implements `drafter.StreamDrafter` with the checkpoint's MTP block.

    Sharded layouts: the MTP block's attention holds the rank's heads and its MoE the rank's
    experts, like the target's blocks, so its forwards run the model's collectives. Every rank
    of a partition observes and proposes for the same sequences; on an expert-parallel layout
    every rank runs one observing forward per step and exactly `max_drafts` chained forwards per
    `propose` (with zero rows where its partition has none), so the ranks of an EP group meet in
    the same collectives whatever their partitions draft.
    """

    tap_layer_ids: tuple[int, ...] = ()

    def __init__(self, model: DeepseekV4, block_size: int, num_blocks: int, dtype: torch.dtype,
                 device: str, max_drafts: int) -> None:
        cfg = model.config
        self._model = model
        self._layer_id = cfg.num_hidden_layers
        self._prefix = "mtp.0."
        self._max_drafts = max_drafts
        self._stream_shape = (cfg.hc_mult, cfg.hidden_size)
        self.cache = PagedKvCache({self._layer_id: cfg.layer_ratio(self._layer_id)}, cfg.head_dim,
                                  cfg.index_head_dim, cfg.sliding_window, block_size, num_blocks,
                                  dtype, device)
        self._pending: dict[int, _Pending] = {}

    def _lockstep(self) -> bool:
        """Expert-parallel: every rank runs the draft passes, with zero rows when idle. Read at
        call time: a rank builds its drafter before it joins the world (DeferredCollectives)."""
        return self._model.collectives.expert_parallel

    @property
    def live_sequences(self) -> int:
        return len(self._pending)

    def observe(self, seq_id: int, start_pos: int, taps: torch.Tensor) -> None:
        raise TypeError("MtpDrafter reads streams: the runtime calls observe_streams")

    def observe_streams(self, observations: list[StreamObservation]) -> None:
        """Write the MTP rows of every position whose next token is now known, all sequences in
        one forward."""
        rows: list = []
        hidden: list[torch.Tensor] = []
        for seen in observations:
            if not seen.token_ids:
                continue
            pending = self._pending.get(seen.seq_id)
            if pending is not None and pending.position == seen.start_pos - 1:
                rows.append((seen.seq_id, seen.start_pos - 1, seen.token_ids, seen.block_tables))
                hidden += [pending.stream[None], seen.streams[:-1]]
            elif len(seen.token_ids) > 1:
                rows.append((seen.seq_id, seen.start_pos, seen.token_ids[1:], seen.block_tables))
                hidden.append(seen.streams[:-1])
            self._pending[seen.seq_id] = _Pending(seen.start_pos + len(seen.token_ids) - 1,
                                                  seen.streams[-1], seen.block_tables)
        if rows or self._lockstep():
            self._forward(rows, self._stacked(hidden))

    def propose(self, requests: list[DraftRequest]) -> list[Draft]:
        """Chained proposals (at most `max_drafts`), batched over the requests; fewer (or none)
        where a sequence's tables end or its newest committed stream is not the anchor's
        predecessor."""
        tokens: dict[int, list[int]] = {r.seq_id: [] for r in requests}
        live = [r for r in requests if self._ready(r)]
        stream = {r.seq_id: self._pending[r.seq_id].stream for r in live}
        last = {r.seq_id: r.anchor_token for r in live}
        wanted = max((r.num_drafts for r in live), default=0)
        passes = self._max_drafts if self._lockstep() else min(wanted, self._max_drafts)
        for k in range(passes):
            live = [r for r in live if k < r.num_drafts and self._covers(r, k)]
            if not live and not self._lockstep():
                break
            rows = [(r.seq_id, r.anchor_pos - 1 + k, [last[r.seq_id]],
                     self._pending[r.seq_id].block_tables) for r in live]
            out = self._forward(rows, self._stacked([stream[r.seq_id][None] for r in live]))
            guesses = (self._model.logits(out, prefix=self._prefix).argmax(dim=-1).tolist()
                       if live else [])
            for r, guess, row_stream in zip(live, guesses, out):
                tokens[r.seq_id].append(guess)
                last[r.seq_id], stream[r.seq_id] = guess, row_stream
        return [Draft(tokens[r.seq_id], [1.0] * len(tokens[r.seq_id])) for r in requests]

    def release(self, seq_id: int) -> None:
        self._pending.pop(seq_id, None)

    def _ready(self, request: DraftRequest) -> bool:
        pending = self._pending.get(request.seq_id)
        return pending is not None and pending.position == request.anchor_pos - 1

    def _covers(self, request: DraftRequest, k: int) -> bool:
        """The sequence's tables hold position anchor_pos - 1 + k."""
        tables = self._pending[request.seq_id].block_tables
        needed = (request.anchor_pos - 1 + k) // self.cache.block_size + 1
        return all(len(table) >= needed for table in tables.values())

    def _stacked(self, streams: list[torch.Tensor]) -> torch.Tensor:
        """Streams [n_i, hc, D] one after the other ([0, hc, D] when there are none)."""
        if streams:
            return torch.cat(streams)
        embed = self._model.w["embed.weight"]
        return embed.new_zeros(0, *self._stream_shape)

    def _forward(self, rows: list, hidden: torch.Tensor) -> torch.Tensor:
        batch = build_batch(rows, str(hidden.device))
        return self._model.mtp_forward(hidden, batch.token_ids, batch, self.cache)
