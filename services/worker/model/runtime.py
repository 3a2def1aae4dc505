"""`ModelRuntime`: one partition's model and paged caches.

A step takes any mix of rows — prefill chunks and single-token decodes of different sequences at
different positions. Linear and MoE work runs batched over every token of the step; cache reads and
attention run per row. The scheduler owns the block tables; the runtime owns the storage behind
them and nothing per sequence: every row carries its block tables, and everything a chunk reads
(raw window rows, compressor rows, compressed entries) is in those blocks, so a chunk may start at
any position whose blocks hold the sequence's earlier tokens (a prefix-cache hit resumes exactly).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from services.worker.model.batch import ChunkRows, StepBatch, build_batch
from services.worker.model.checkpoint import CheckpointReader
from services.worker.model.collectives import Collectives, LocalCollectives
from services.worker.model.config import ModelConfig
from services.worker.model.drafter import Drafter
from services.worker.model.drafting import run_drafter
from services.worker.model.kv_cache import (FAMILY_GROUPS, BlockTables, PagedKvCache,
                                            block_group_windows, first_needed_block,
                                            rows_per_block)
from services.worker.model.parallel import ParallelLayout, check_topology
from services.worker.model.sampling import NO_ALLOWED_TOKEN, NoAllowedToken, greedy_rows, select_rows
from services.worker.model.sharding import rank_selection
from services.worker.model.transformer import DeepseekV4
from services.worker.model.verification import PositionMask, sampled_offsets, verify
from services.worker.model.weights import ModelWeights


@dataclass(frozen=True)
class RuntimeConfig:
    model_dir: Path
    dtype: torch.dtype            # float32 default on CPU, bfloat16 on CUDA
    device: str                   # "cpu" / "cuda:0"
    block_size: int
    num_blocks: int               # per block group, per partition


@dataclass
class SequenceChunk:
    """One row of a step."""

    seq_id: int
    start_pos: int                # positions already cached
    token_ids: list[int]          # tokens at positions start_pos .. start_pos+len-1
    # Per block group (kv_cache.py), logical order, covering start_pos+len tokens. Entries older
    # than a windowed group's window before start_pos are never read (stale ids, or -1).
    block_tables: BlockTables
    sample: bool
    allowed_token_ids: Optional[torch.Tensor] = None   # int64 [n], grammar mask (short form)
    token_bitmask: Optional[torch.Tensor] = None       # int32 [ceil(V/32)], grammar mask (long)
    logit_bias: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # (ids int64, values float32)
    # The last `num_drafts` tokens are speculative (verification.py): the target samples at the
    # last known position and after every drafted token; `draft_masks` holds the masks of those
    # sampled positions after the first (the mask fields above serve the first).
    num_drafts: int = 0
    draft_forced: list[bool] = field(default_factory=list)
    draft_masks: list[PositionMask] = field(default_factory=list)
    # Ask the drafter for this many proposals after the newest committed token (sample rows).
    num_proposals: int = 0

    @property
    def forced_flags(self) -> list[bool]:
        return self.draft_forced or [False] * self.num_drafts

    @property
    def num_known(self) -> int:
        """Tokens of the chunk that are not speculative."""
        return len(self.token_ids) - self.num_drafts


@dataclass
class StepOutput:
    sampled: list[Optional[int]]            # per chunk: the greedy token, None if not sampled
    logits: list[Optional[torch.Tensor]]    # per chunk: fp32 [V], last position (return_logits)
    # return_logits: the batch those rows are views of, and each chunk's row in it (sample rows
    # again with `sampling.select_rows(logits_batch, ...)`: a stack of the views is slow on CPU).
    logits_batch: Optional[torch.Tensor] = None
    logits_row: list[Optional[int]] = field(default_factory=list)
    # Per chunk: why sampling failed (a grammar mask that allows nothing), else None.
    errors: list[Optional[str]] = field(default_factory=list)
    # Per chunk: last-layer hc streams [len, hc, D] (return_hidden; the MTP block's input).
    hidden: list[Optional[torch.Tensor]] = field(default_factory=list)
    # Per chunk: the `return_taps` layers' outputs averaged over the hc copies
    # [len, len(return_taps), D] (a drafter's `observe` input); None when no layer is tapped.
    taps: list[Optional[torch.Tensor]] = field(default_factory=list)
    # Per chunk: draft tokens accepted (the sampled token is the bonus after them), and the
    # drafter's proposals after the sampled token.
    num_accepted: list[int] = field(default_factory=list)
    proposals: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class BlockCost:
    """Bytes of one logical block per block group and per family (kv_cache.py)."""

    group_block_bytes: dict[str, int]     # window, compressed, csa_state, hca_state
    family_block_bytes: dict[str, int]    # ori, cmp_c4, cmp_c128, idx, csa_state, ...
    group_windows: dict[str, int]         # tokens of window each group keeps; 0 = whole sequence

    @property
    def all_groups_block_bytes(self) -> int:
        """One block of every group: the cost of one more `--num-blocks`."""
        return sum(self.group_block_bytes.values())


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
        # Speculative decoding's draft model (drafter.py); None: no proposals.
        self.drafter: Optional[Drafter] = None
        main_layers = {i: self.config.layer_ratio(i) for i in range(self.config.num_hidden_layers)}
        self.cache = PagedKvCache(main_layers, self.config.head_dim, self.config.index_head_dim,
                                  self.config.sliding_window, cfg.block_size, cfg.num_blocks,
                                  cfg.dtype, cfg.device)

    def step(self, chunks: list[SequenceChunk], return_logits: bool = False,
             return_hidden: bool = False, return_taps: tuple[int, ...] = ()) -> StepOutput:
        """Run one forward over every chunk; sample the last position of chunks with `sample`.
        `return_taps`: main layer ids whose outputs come back per chunk (`StepOutput.taps`).

        Raises ValueError for a malformed step (a sequence twice, a block table missing, too
        short or holding an id outside the pool where the chunk reads or writes); caches are
        untouched then.
        """
        if not chunks and not self._collectives.expert_parallel:
            return StepOutput(sampled=[], logits=[], errors=[], hidden=[], taps=[])
        self._check(chunks)
        with torch.inference_mode():
            batch = build_batch([(c.seq_id, c.start_pos, c.token_ids, c.block_tables)
                                 for c in chunks], self.cfg.device)
            hidden, taps = self.model.forward_hidden(batch, self.cache,
                                                     return_taps or self._drafter_taps())
            out = self._outputs(chunks, batch, hidden, return_logits, return_hidden)
            out.taps = [taps[rows.rows] if return_taps else None for rows in batch.chunks]
            if self.drafter is not None:
                run_drafter(self.drafter, chunks, batch, hidden, taps, out)
            return out

    def _drafter_taps(self) -> tuple[int, ...]:
        return self.drafter.tap_layer_ids if self.drafter is not None else ()

    def release(self, seq_id: int) -> None:
        """The sequence is gone: the drafter drops what it keeps for it."""
        if self.drafter is not None:
            self.drafter.release(seq_id)

    def _outputs(self, chunks: list[SequenceChunk], batch: StepBatch, hidden: torch.Tensor,
                 return_logits: bool, return_hidden: bool) -> StepOutput:
        wanted = [i for i, c in enumerate(chunks) if c.sample or return_logits]
        row_lists = [self._sampled_rows(chunks[i], batch.chunks[i]) for i in wanted]
        flat = torch.tensor([r for rows in row_lists for r in rows], dtype=torch.int64)
        logits = self.model.logits(hidden[flat.to(hidden.device)]) if wanted else None
        n = len(chunks)
        out = StepOutput(sampled=[None] * n, logits=[None] * n, errors=[None] * n,
                         hidden=[None] * n, num_accepted=[0] * n, proposals=[[] for _ in chunks])
        tokens = greedy_tokens(chunks, wanted, row_lists, logits)
        if return_logits:
            out.logits_batch, out.logits_row = logits, [None] * n
        first = 0
        for i, rows in zip(wanted, row_lists):
            if return_logits:
                out.logits[i], out.logits_row[i] = logits[first], first
            first += len(rows)
            if chunks[i].sample:
                self._sample(chunks[i], tokens[i], i, out)
        if return_hidden:
            for i, rows in enumerate(batch.chunks):
                out.hidden[i] = hidden[rows.rows]
        return out

    @staticmethod
    def _sampled_rows(chunk: SequenceChunk, rows: ChunkRows) -> list[int]:
        """Flat batch rows of the chunk's sampled positions (the last one without drafts)."""
        last_known = rows.rows.stop - 1 - chunk.num_drafts
        if not chunk.sample:
            return [last_known]
        return [last_known + k for k in sampled_offsets(chunk.num_drafts, chunk.forced_flags)]

    def _sample(self, chunk: SequenceChunk, tokens: list[Optional[int]], i: int,
                out: StepOutput) -> None:
        """Chunk `i`'s token (verification of its drafts, if any) from the greedy `tokens` of its
        sampled positions; a position whose mask allows nothing fails the chunk if reached."""
        offsets = sampled_offsets(chunk.num_drafts, chunk.forced_flags)

        def sample_at(offset: int) -> int:
            token = tokens[offsets.index(offset)]
            if token is None:
                raise NoAllowedToken(NO_ALLOWED_TOKEN)
            return token
        try:
            verdict = verify(chunk.token_ids[chunk.num_known:], chunk.forced_flags, sample_at)
        except NoAllowedToken as exc:
            out.errors[i] = str(exc)
            return
        out.sampled[i], out.num_accepted[i] = verdict.bonus_token, verdict.num_accepted

    def _check(self, chunks: list[SequenceChunk]) -> None:
        seen: set[int] = set()
        for c in chunks:
            if c.seq_id in seen:
                raise ValueError(f"sequence {c.seq_id} appears twice in one step")
            seen.add(c.seq_id)
            if not c.token_ids:
                raise ValueError(f"sequence {c.seq_id}: empty chunk")
            for group, window in self.cache.group_windows.items():
                self._check_table(c, group, window)

    def _check_table(self, c: SequenceChunk, group: str, window: int) -> None:
        """The blocks the chunk may read or write in `group` exist and are in the pool."""
        bs, end = self.cfg.block_size, c.start_pos + len(c.token_ids)
        table = c.block_tables.get(group)
        if table is None:
            raise ValueError(f"sequence {c.seq_id}: no block table for group {group!r}")
        needed = math.ceil(end / bs)
        if len(table) < needed:
            raise ValueError(f"sequence {c.seq_id}: {group} table has {len(table)} blocks, "
                             f"{needed} needed for {end} tokens")
        first = first_needed_block(window, c.start_pos, bs)
        if any(not 0 <= b < self.cfg.num_blocks for b in table[first:needed]):
            raise ValueError(f"sequence {c.seq_id}: {group} table holds a block id outside "
                             f"[0, {self.cfg.num_blocks}) where position {c.start_pos} reads")

    @staticmethod
    def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype,
                    layer_ids: Optional[range] = None) -> BlockCost:
        """Cache bytes of one logical block per group and family for `layer_ids` (default: the
        main layers; the MTP drafter's cache holds the MTP layer). Compressor rows are fp32 kv +
        score per token, 2c wide with overlap (ratio 4)."""
        elem, fp32 = torch.empty((), dtype=dtype).element_size(), 4
        ids = range(config.num_hidden_layers) if layer_ids is None else layer_ids
        ratios = [config.layer_ratio(i) for i in ids]
        n_c4, n_c128 = ratios.count(4), ratios.count(128)
        d, d_idx, bs = config.head_dim, config.index_head_dim, block_size
        families = {
            "ori": len(ratios) * bs * d * elem,
            "cmp_c4": n_c4 * rows_per_block(bs, 4) * d * elem,
            "cmp_c128": n_c128 * rows_per_block(bs, 128) * d * elem,
            "idx": n_c4 * rows_per_block(bs, 4) * d_idx * elem,
            "csa_state": n_c4 * bs * 2 * (2 * d) * fp32,
            "csa_inner_state": n_c4 * bs * 2 * (2 * d_idx) * fp32,
            "hca_state": n_c128 * bs * 2 * d * fp32,
        }
        windows = block_group_windows(ratios, config.sliding_window)
        families = {name: size for name, size in families.items()
                    if FAMILY_GROUPS[name] in windows}
        groups = {group: sum(size for name, size in families.items()
                             if FAMILY_GROUPS[name] == group) for group in windows}
        return BlockCost(group_block_bytes=groups, family_block_bytes=families,
                         group_windows=windows)


def greedy_tokens(chunks: list[SequenceChunk], wanted: list[int], row_lists: list[list[int]],
                  logits: Optional[torch.Tensor]) -> dict[int, list[Optional[int]]]:
    """The greedy token of every sampled position of the sampling chunks among `wanted` (their
    rows of `logits` in order: `row_lists`), all in one batch; by chunk index."""
    picked, masks, biases, counts = [], [], [], {}
    first = 0
    for i, rows in zip(wanted, row_lists):
        if chunks[i].sample:
            picked.extend(range(first, first + len(rows)))
            masks.extend(position_masks(chunks[i], len(rows)))
            biases.extend([chunks[i].logit_bias] * len(rows))
            counts[i] = len(rows)
        first += len(rows)
    if not picked:
        return {}
    tokens = iter(greedy_rows(select_rows(logits, picked), masks, biases))
    return {i: [next(tokens) for _ in range(count)] for i, count in counts.items()}


def position_masks(chunk: SequenceChunk, num_sampled: int) -> list[PositionMask]:
    """The masks of the chunk's `num_sampled` sampled positions: its own, then its drafts'."""
    masks = [(chunk.allowed_token_ids, chunk.token_bitmask)]
    masks += list(chunk.draft_masks) or [(None, None)] * (num_sampled - 1)
    if len(masks) < num_sampled:
        raise ValueError(f"sequence {chunk.seq_id}: {len(masks) - 1} draft masks for "
                         f"{num_sampled - 1} sampled draft positions")
    return masks[:num_sampled]
