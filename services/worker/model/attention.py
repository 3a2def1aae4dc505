"""DeepSeek-V4 attention of one layer over paged caches: sliding window + compressed entries.

One shared kv vector per token serves as key and value. Projections run batched over every row of
the step; the cache reads and the softmax run per chunk (one sequence's rows).

Every query attends over a key layout that depends only on its own position — W window slots, then
its c(t) compressed slots — so its arithmetic (and every discrete decision downstream: FP8 rounding,
top-k) is the same however the sequence was chunked or batched.

Keys visible to query t: raw kv at positions max(0, t−W+1)..t (the `window` group), plus compressed
entry j iff j < (t+1)//ratio — all of them for ratio 128, the indexer's top-k for ratio 4.
A per-head sink adds exp(sink) to the softmax denominator and has no value.
"""
from __future__ import annotations

from typing import Optional

import torch

from services.worker.model import compressor, numerics
from services.worker.model.batch import ChunkRows, StepBatch
from services.worker.model.collectives import Collectives
from services.worker.model.config import ModelConfig
from services.worker.model.compressor import CompressorSpec
from services.worker.model.kv_cache import COMPRESSED, STATE_GROUPS, WINDOW, PagedKvCache
from services.worker.model.parallel import ParallelLayout
from services.worker.model.weights import ModelWeights


class AttentionLayer:
    """One layer's attention on this rank: its TP share of the heads (see parallel.py); the kv
    vector, compressors, indexer and caches are the whole layer's on every rank."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, layer_id: int, prefix: str,
                 layout: ParallelLayout, collectives: Collectives):
        self.config = config
        self.w = weights
        self.layer_id = layer_id
        self.prefix = prefix                  # e.g. "layers.3.attn."
        self.num_heads = len(layout.heads(config))
        self.num_groups = len(layout.o_groups(config))
        self.collectives = collectives
        self.ratio = config.layer_ratio(layer_id)
        rd = config.qk_rope_head_dim
        if self.ratio == 0:
            # Sliding-window-only layers: plain RoPE, no YaRN.
            self.inv_freq = numerics.rope_inv_freq(rd, config.rope_theta, None)
        else:
            ys = config.rope_scaling
            yarn = None if ys is None else (ys.original_max_position_embeddings, ys.factor,
                                            ys.beta_fast, ys.beta_slow)
            self.inv_freq = numerics.rope_inv_freq(rd, config.compress_rope_theta, yarn)
        self.inv_freq = self.inv_freq.to(weights[prefix + "attn_sink"].device)
        self.kv_spec: Optional[CompressorSpec] = None
        self.index_spec: Optional[CompressorSpec] = None
        if self.ratio:
            self.kv_spec = CompressorSpec(prefix + "compressor.", self.ratio, config.head_dim, rd,
                                          rotate=False)
        if self.ratio == 4:
            self.index_spec = CompressorSpec(prefix + "indexer.compressor.", 4,
                                             config.index_head_dim, rd, rotate=True)

    # ---- projections (all rows of the step; public for the DSpark draft stages) ----------------
    def rope(self, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False
             ) -> torch.Tensor:
        rot = numerics.rope_table(self.inv_freq, positions)
        return numerics.apply_rope(x, rot, self.config.qk_rope_head_dim, inverse)

    def queries(self, y: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """y [T, D] → (q_norm(wq_a(y)) [T, q_lora], per-head normalised roped q [T, H, d])."""
        cfg, w, p = self.config, self.w, self.prefix
        eps = cfg.rms_norm_eps
        qr = numerics.rms_norm(numerics.linear(y, w[p + "wq_a.weight"]), w[p + "q_norm.weight"],
                               eps)
        q = numerics.linear(qr, w[p + "wq_b.weight"])
        q = q.view(-1, self.num_heads, cfg.head_dim)
        return qr, self.rope(numerics.rms_norm(q, None, eps), positions)

    def kv(self, y: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """y [T, D] → the shared key/value vector [T, d]: wkv, kv_norm, RoPE, FP8 round trip."""
        cfg, w, p = self.config, self.w, self.prefix
        rd = cfg.qk_rope_head_dim
        kv = numerics.rms_norm(numerics.linear(y, w[p + "wkv.weight"]), w[p + "kv_norm.weight"],
                               cfg.rms_norm_eps)
        kv = self.rope(kv, positions)
        # QAT: the non-rope dims go through an FP8 round trip (blocks of 64).
        return torch.cat([numerics.fp8_round_trip(kv[:, :-rd], 64), kv[:, -rd:]], dim=-1)

    def _index_queries(self, y: torch.Tensor, qr: torch.Tensor, positions: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, w, p = self.config, self.w, self.prefix + "indexer."
        q = numerics.linear(qr, w[p + "wq_b.weight"])
        q = q.view(-1, cfg.index_n_heads, cfg.index_head_dim)
        q = numerics.fp4_round_trip(numerics.hadamard_rotate(self.rope(q, positions)), 32)
        head_weights = numerics.linear(y, w[p + "weights_proj.weight"]) * (
            cfg.index_head_dim ** -0.5 * cfg.index_n_heads ** -0.5)
        return q, head_weights

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, y: torch.Tensor, batch: StepBatch, cache: PagedKvCache) -> torch.Tensor:
        """y [T, D] (attn_norm output) → [T, D]. Writes this step's raw rows, compressor rows and
        completed entries into `cache`."""
        cfg, w, p = self.config, self.w, self.prefix
        positions = batch.positions
        qr, q = self.queries(y, positions)
        kv = self.kv(y, positions)
        projected = {}
        if self.kv_spec is not None:
            projected["kv"] = compressor.project(self.kv_spec, w, y, positions)
        if self.index_spec is not None:
            projected["index"] = compressor.project(self.index_spec, w, y, positions)
            index_q, index_w = self._index_queries(y, qr, positions)
        out = torch.empty_like(q)
        for chunk in batch.chunks:
            rows = chunk.rows
            window_keys, window_mask = self._window(chunk, kv[rows], cache)
            n_rows = window_keys.shape[0]
            cmp_keys = window_keys.new_zeros(n_rows, 0, cfg.head_dim)
            cmp_counts = torch.zeros(n_rows, dtype=torch.int64, device=q.device)
            if self.kv_spec is not None:
                entries = self._compress(self.kv_spec, "kv", chunk, projected["kv"], rows, cache,
                                         cache.entries[self.layer_id])
                cmp_counts = (chunk.positions + 1) // self.ratio
                cmp_keys = entries.expand(n_rows, -1, -1)
                if self.index_spec is not None:
                    keys = self._compress(self.index_spec, "index", chunk, projected["index"],
                                          rows, cache, cache.index_keys[self.layer_id])
                    cmp_keys, cmp_counts = self._select(index_q[rows], index_w[rows], keys,
                                                        entries, cmp_counts)
            out[rows] = attend(q[rows], window_keys, window_mask, cmp_keys, cmp_counts,
                               w[p + "attn_sink"], cfg.head_dim ** -0.5)
        return self.output(self.rope(out, positions, inverse=True))

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """Grouped low-rank projection: heads split into o_groups contiguous groups, each through
        its slice of wo_a, concatenated (over the TP ranks' groups), then wo_b (this rank's output
        rows, concatenated over the TP ranks). o [T, H_local, d] → [T, D]."""
        cfg, w, p = self.config, self.w, self.prefix
        if o.shape[0] == 0:  # an idle partition: every rank of its TP group skips the gathers
            return o.new_zeros(0, cfg.hidden_size)
        groups = self.num_groups
        wo_a = w[p + "wo_a.weight"].view(groups, cfg.o_lora_rank, -1)
        grouped = o.reshape(o.shape[0], groups, -1)
        low_rank = torch.cat([numerics.linear(grouped[:, g], wo_a[g]) for g in range(groups)],
                             dim=-1)
        low_rank = self.collectives.tp_concat(low_rank)
        return self.collectives.tp_concat(numerics.linear(low_rank, w[p + "wo_b.weight"]))

    def _window(self, chunk: ChunkRows, kv: torch.Tensor, cache: PagedKvCache
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the chunk's raw rows, read back each query's window
        → (keys [L, W, d] for positions t−W+1..t, mask [L, W]: False before position 0)."""
        table = chunk.block_tables[WINDOW]
        cache.write_window(self.layer_id, cache.slots(table, chunk.positions), kv)
        window = self.config.sliding_window
        offsets = torch.arange(1 - window, 1, device=kv.device)
        key_pos = chunk.positions[:, None] + offsets[None, :]
        mask = key_pos >= 0
        slots = cache.slots(table, key_pos.clamp(min=0).flatten())
        keys = cache.read_window(self.layer_id, slots).view(*key_pos.shape, -1)
        return keys.masked_fill(~mask[..., None], 0), mask

    def _compress(self, spec: CompressorSpec, name: str, chunk: ChunkRows,
                  projected: tuple[torch.Tensor, torch.Tensor], rows: slice,
                  cache: PagedKvCache, store: torch.Tensor) -> torch.Tensor:
        """Store the chunk's compressor rows, pool the entries its tokens complete (reading their
        rows back, including earlier chunks' or a cached prefix's), store them → all entries so
        far."""
        m, key = spec.ratio, (self.layer_id, name)
        state_table = chunk.block_tables[STATE_GROUPS[m]]
        entry_table = chunk.block_tables[COMPRESSED]
        cache.write_rows(key, state_table, chunk.positions, projected[0][rows], projected[1][rows])
        first, end = chunk.start_pos // m, chunk.end_pos // m
        if end > first:
            lookback = m if spec.overlap else 0
            kv, score = cache.read_rows(key, state_table, first * m - lookback, end * m)
            raw = compressor.pool(spec, kv, score, end - first)
            entries = compressor.finish(spec, self.w, raw, first, self.inv_freq, store.dtype,
                                        self.config.rms_norm_eps)
            cache.write_entries(store, entry_table, first, m, entries)
        return cache.read_entries(store, entry_table, end, m)

    def _select(self, index_q: torch.Tensor, index_w: torch.Tensor, index_keys: torch.Tensor,
                entries: torch.Tensor, n_visible: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Indexer: score Σ_h relu(q_h·k_j)·w_h over each query's n_visible entries and keep the
        top index_topk → (chosen entries [L, k, d], count per query [L]: its first slots).

        Exact ties are common (relu zeros) and torch.topk breaks them by the row's length, so
        each query ranks a row of exactly its own visible entries, as a decode step does. This
        keeps the choice independent of how the sequence was chunked.
        """
        topk = self.config.index_topk
        k = min(topk, entries.shape[0])
        chosen = torch.zeros(index_q.shape[0], k, dtype=torch.int64, device=index_q.device)
        if k:
            scores = (torch.einsum("lhd,nd->lhn", index_q, index_keys).relu()
                      * index_w.unsqueeze(-1)).sum(dim=1)
            for n in torch.unique(n_visible).tolist():
                if n:
                    rows = n_visible == n
                    chosen[rows, :min(k, n)] = scores[rows, :n].topk(min(k, n), dim=-1).indices
        return entries[chosen], n_visible.clamp(max=topk)


def attend(q: torch.Tensor, window_keys: torch.Tensor, window_mask: torch.Tensor,
           cmp_keys: torch.Tensor, cmp_counts: torch.Tensor, sink: torch.Tensor, scale: float
           ) -> torch.Tensor:
    """q [L, H, d]; window keys [L, W, d] with mask [L, W]; compressed keys [L, n, d] of which
    query l sees the first cmp_counts[l].

    fp32 softmax over the visible keys whose denominator also holds exp(sink_h). Queries are
    grouped by their compressed count so each runs on exactly its own W + c keys.
    """
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for count in torch.unique(cmp_counts).tolist():
        rows = cmp_counts == count
        keys = torch.cat([window_keys[rows], cmp_keys[rows, :count]], dim=1).float()
        # Keys × queries, heads as the GEMM's output columns: a head's scores then do not depend
        # on how many heads sit beside it (a TP rank holds a slice), bit for bit on CPU.
        scores = torch.einsum("lkd,lhd->lkh", keys, q[rows].float()).transpose(1, 2).mul(scale)
        visible = _key_mask(window_mask[rows], count)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        sink_col = sink.float()[None, :, None].expand(scores.shape[0], -1, 1)
        lse = torch.logsumexp(torch.cat([scores, sink_col], dim=-1), dim=-1, keepdim=True)
        out[rows] = torch.einsum("lhk,lkd->lhd", torch.exp(scores - lse), keys)
    return out.to(q.dtype)


def _key_mask(window_mask: torch.Tensor, count: int) -> torch.Tensor:
    """[L, W + count]: the window mask followed by `count` visible compressed slots."""
    visible = window_mask.new_ones(window_mask.shape[0], count)
    return torch.cat([window_mask, visible], dim=1)
