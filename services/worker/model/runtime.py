"""`ModelRuntime`: one partition's model, paged caches and per-sequence compressor states.

A step takes any mix of rows — prefill chunks and single-token decodes of different sequences at
different positions. Linear and MoE work runs batched over every token of the step; cache reads and
attention run per row. The scheduler owns the block tables; the runtime owns the storage behind
them and each sequence's compressor states (dropped by `free_sequence`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from services.worker.model.attention import SequenceState
from services.worker.model.batch import StepBatch, build_batch
from services.worker.model.checkpoint import CheckpointReader
from services.worker.model.collectives import Collectives, LocalCollectives
from services.worker.model.config import ModelConfig
from services.worker.model.kv_cache import PagedKvCache, rows_per_block
from services.worker.model.parallel import ParallelLayout, check_topology
from services.worker.model.sampling import NoAllowedToken, greedy_sample
from services.worker.model.sharding import rank_selection
from services.worker.model.transformer import DeepseekV4
from services.worker.model.weights import ModelWeights


@dataclass(frozen=True)
class RuntimeConfig:
    model_dir: Path
    dtype: torch.dtype            # float32 default on CPU, bfloat16 on CUDA
    device: str                   # "cpu" / "cuda:0"
    block_size: int
    num_blocks: int               # compressed group, per partition
    num_window_blocks: int        # window group, per partition


@dataclass
class SequenceChunk:
    """One row of a step."""

    seq_id: int
    start_pos: int                # positions already cached
    token_ids: list[int]          # tokens at positions start_pos .. start_pos+len-1
    block_table: list[int]        # compressed group, logical order, covers start_pos+len tokens
    window_block_table: list[int]  # window group, logical order (released prefix entries are stale)
    sample: bool
    allowed_token_ids: Optional[torch.Tensor] = None   # int64 [n], grammar mask (short form)
    token_bitmask: Optional[torch.Tensor] = None       # int32 [ceil(V/32)], grammar mask (long)
    logit_bias: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (ids int64, values float32)


@dataclass
class StepOutput:
    sampled: list[Optional[int]]            # per chunk: the greedy token, None if not sampled
    logits: list[Optional[torch.Tensor]]    # per chunk: fp32 [V], last position (return_logits)
    # Per chunk: why sampling failed (a grammar mask that allows nothing), else None.
    errors: list[Optional[str]] = field(default_factory=list)
    # Per chunk: last-layer hc streams [len, hc, D] (return_hidden; the MTP block's input).
    hidden: list[Optional[torch.Tensor]] = field(default_factory=list)


@dataclass(frozen=True)
class BlockCost:
    """Bytes of one logical block per group and family, plus per-sequence recurrent state."""

    window_block_bytes: int               # `window` group: family `ori`
    compressed_block_bytes: int           # `compressed` group: `cmp_c4` + `cmp_c128` + `idx`
    family_block_bytes: dict[str, int]    # ori, cmp_c4, cmp_c128, idx
    sequence_state_bytes: dict[str, int]  # csa_state, csa_inner_state, hca_state (fp32, at most)

    @property
    def per_sequence_state_bytes(self) -> int:
        return sum(self.sequence_state_bytes.values())


class ModelRuntime:
    """One rank's model and the caches of its partition. `layout` says which share of the model
    the rank holds (it loads only that share); `collectives` joins it with the other ranks."""

    def __init__(self, cfg: RuntimeConfig, layout: ParallelLayout = ParallelLayout(),
                 collectives: Collectives = LocalCollectives()):
        self.cfg = cfg
        self.config = ModelConfig.from_json_file(Path(cfg.model_dir) / "config.json")
        check_topology(self.config, layout.dp, layout.tp, layout.ep)
        with CheckpointReader(cfg.model_dir) as reader:
            tensors = reader.load_all(self.config, cfg.dtype, cfg.device,
                                      rank_selection(self.config, layout))
        self.weights = ModelWeights(tensors, cfg.dtype, cfg.device)
        del tensors
        self.model = DeepseekV4(self.config, self.weights, layout, collectives)
        self._collectives = collectives
        main_layers = {i: self.config.layer_ratio(i) for i in range(self.config.num_hidden_layers)}
        self.cache = PagedKvCache(main_layers, self.config.head_dim, self.config.index_head_dim,
                                  cfg.block_size, cfg.num_blocks, cfg.num_window_blocks,
                                  cfg.dtype, cfg.device)
        self._states: dict[int, SequenceState] = {}

    @property
    def live_sequences(self) -> int:
        """Sequences holding compressor state (started, not yet freed)."""
        return len(self._states)

    def step(self, chunks: list[SequenceChunk], return_logits: bool = False,
             return_hidden: bool = False) -> StepOutput:
        """Run one forward over every chunk; sample the last position of chunks with `sample`.

        Raises ValueError for a malformed step (a sequence twice, a block table too short, a
        sequence resumed at start_pos > 0 after `free_sequence` or never started); caches and
        states are untouched then.
        """
        if not chunks and not self._collectives.expert_parallel:
            return StepOutput(sampled=[], logits=[], errors=[], hidden=[])
        self._check(chunks)
        for c in chunks:
            if c.start_pos == 0:
                # Position 0 starts the sequence over (e.g. recompute after preemption).
                self._states.pop(c.seq_id, None)
        with torch.inference_mode():
            batch = build_batch([(c.seq_id, c.start_pos, c.token_ids, c.block_table,
                                  c.window_block_table) for c in chunks], self.cfg.device)
            hidden = self.model.forward_hidden(batch, self.cache, self._states)
            return self._outputs(chunks, batch, hidden, return_logits, return_hidden)

    def free_sequence(self, seq_id: int) -> None:
        """Drop a finished sequence's compressor states (its blocks belong to the scheduler)."""
        self._states.pop(seq_id, None)

    def _outputs(self, chunks: list[SequenceChunk], batch: StepBatch, hidden: torch.Tensor,
                 return_logits: bool, return_hidden: bool) -> StepOutput:
        wanted = [i for i, c in enumerate(chunks) if c.sample or return_logits]
        last_rows = torch.tensor([batch.chunks[i].rows.stop - 1 for i in wanted], dtype=torch.int64)
        logits = self.model.logits(hidden[last_rows.to(hidden.device)]) if wanted else None
        out = StepOutput(sampled=[None] * len(chunks), logits=[None] * len(chunks),
                         errors=[None] * len(chunks), hidden=[None] * len(chunks))
        for k, i in enumerate(wanted):
            chunk, row_logits = chunks[i], logits[k]
            if return_logits:
                out.logits[i] = row_logits
            if chunk.sample:
                try:
                    out.sampled[i] = greedy_sample(row_logits, chunk.allowed_token_ids,
                                                   chunk.token_bitmask, chunk.logit_bias)
                except NoAllowedToken as exc:
                    out.errors[i] = str(exc)
        if return_hidden:
            for i, rows in enumerate(batch.chunks):
                out.hidden[i] = hidden[rows.rows]
        return out

    def _check(self, chunks: list[SequenceChunk]) -> None:
        bs = self.cfg.block_size
        seen: set[int] = set()
        for c in chunks:
            if c.seq_id in seen:
                raise ValueError(f"sequence {c.seq_id} appears twice in one step")
            seen.add(c.seq_id)
            if not c.token_ids:
                raise ValueError(f"sequence {c.seq_id}: empty chunk")
            if c.start_pos > 0 and c.seq_id not in self._states:
                # Compressor states are not in the paged caches: a sequence must be computed
                # from position 0 in this runtime (prefix-cache hits are not resumable yet).
                raise ValueError(f"sequence {c.seq_id}: starts at position {c.start_pos} "
                                 f"without compressor state (chunks must start at 0)")
            needed = math.ceil((c.start_pos + len(c.token_ids)) / bs)
            for name, table, limit in (("block_table", c.block_table, self.cfg.num_blocks),
                                       ("window_block_table", c.window_block_table,
                                        self.cfg.num_window_blocks)):
                if len(table) < needed:
                    raise ValueError(f"sequence {c.seq_id}: {name} has {len(table)} blocks, "
                                     f"{needed} needed for {c.start_pos + len(c.token_ids)} tokens")
                if any(not 0 <= b < limit for b in table[:needed]):
                    raise ValueError(f"sequence {c.seq_id}: {name} holds a block id outside "
                                     f"[0, {limit})")

    @staticmethod
    def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> BlockCost:
        """Cache bytes of one logical block per group/family for the main layers, and the
        per-sequence compressor state (fp32: kv + score rows of the current and, with overlap,
        the previous block)."""
        elem = torch.empty((), dtype=dtype).element_size()
        ratios = [config.layer_ratio(i) for i in range(config.num_hidden_layers)]
        n_c4, n_c128 = ratios.count(4), ratios.count(128)
        d, d_idx = config.head_dim, config.index_head_dim
        families = {
            "ori": len(ratios) * block_size * d * elem,
            "cmp_c4": n_c4 * rows_per_block(block_size, 4) * d * elem,
            "cmp_c128": n_c128 * rows_per_block(block_size, 128) * d * elem,
            "idx": n_c4 * rows_per_block(block_size, 4) * d_idx * elem,
        }
        fp32 = 4
        states = {
            "csa_state": n_c4 * 2 * (2 * 4) * (2 * d) * fp32,
            "csa_inner_state": n_c4 * 2 * (2 * 4) * (2 * d_idx) * fp32,
            "hca_state": n_c128 * 2 * 128 * d * fp32,
        }
        return BlockCost(window_block_bytes=families["ori"],
                         compressed_block_bytes=families["cmp_c4"] + families["cmp_c128"]
                         + families["idx"],
                         family_block_bytes=families, sequence_state_bytes=states)
