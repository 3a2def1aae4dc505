"""Paged cache storage of one partition, addressed through the scheduler's logical block tables.

Block groups (docs/structure.md "Cache model"), each with its own block table per sequence:
- `window`: raw kv rows (`ori`) of every layer; logical block i holds positions [i·bs, (i+1)·bs).
  Window: the model's sliding_window.
- `compressed`: compressed entries (`cmp_c4`, `cmp_c128`) and indexer keys (`idx`), for the whole
  sequence. Logical block i holds the entries whose *last* token lies in [i·bs, (i+1)·bs): an entry
  is written by the step that computes its last token, so once every position of a block is
  computed the block is never written again (a prefix-cache block is immutable).
- `csa_state` / `hca_state`: the per-token rows of the ratio-4 / ratio-128 compressors (projected kv
  and gate score, fp32), logical block i holding positions [i·bs, (i+1)·bs). Pooling entry j reads
  the rows of its own `ratio` tokens and, with overlap (ratio 4), of the block before: the window
  is 8 tokens for ratio 4 and 128 for ratio 128. A chunk may start at any position whose rows are
  in the cache, and pooling reads the same rows in the same order however the sequence was
  chunked, so a prefix-cache hit resumes exactly.
Pooling at position t only reads rows of positions ≤ t: rows written past the committed length
(rejected drafts) are never read and are overwritten later.

This class owns the storage tensors only; block tables belong to the scheduler and arrive with
each chunk. It never decides which blocks are live.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch

WINDOW = "window"
COMPRESSED = "compressed"
# The compressor-row group of each compression ratio, and the tokens its pooling looks back over.
STATE_GROUPS = {4: "csa_state", 128: "hca_state"}
STATE_WINDOWS = {4: 8, 128: 128}
# Which block group holds each family's rows.
FAMILY_GROUPS = {"ori": WINDOW, "cmp_c4": COMPRESSED, "cmp_c128": COMPRESSED, "idx": COMPRESSED,
                 "csa_state": "csa_state", "csa_inner_state": "csa_state",
                 "hca_state": "hca_state"}

BlockTables = dict[str, list[int]]


def rows_per_block(block_size: int, ratio: int) -> int:
    return math.ceil(block_size / ratio)


def block_group_windows(layer_ratios: Iterable[int], sliding_window: int) -> dict[str, int]:
    """The block groups a model's layers need → tokens of window each keeps (0: whole sequence)."""
    ratios = set(layer_ratios) - {0}
    groups = {WINDOW: sliding_window}
    if ratios:
        groups[COMPRESSED] = 0
    for ratio in sorted(ratios):
        groups[STATE_GROUPS[ratio]] = STATE_WINDOWS[ratio]
    return groups


def first_needed_block(group_window: int, start_pos: int, block_size: int) -> int:
    """The first logical block a chunk starting at `start_pos` may read in a group."""
    if group_window == 0:
        return 0
    return max(0, start_pos - group_window + 1) // block_size


class PagedKvCache:
    def __init__(self, layer_ratios: dict[int, int], head_dim: int, index_head_dim: int,
                 sliding_window: int, block_size: int, num_blocks: int, dtype: torch.dtype,
                 device: str):
        """layer_ratios: compression ratio (0, 4, 128) of every layer this cache serves;
        num_blocks: blocks of every block group."""
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.group_windows = block_group_windows(layer_ratios.values(), sliding_window)
        self.window: dict[int, torch.Tensor] = {}
        self.entries: dict[int, torch.Tensor] = {}      # cmp_c4 / cmp_c128, by layer id
        self.index_keys: dict[int, torch.Tensor] = {}   # idx, by layer id (ratio-4 layers)
        # (layer id, "kv" | "index") → fp32 [blocks, bs, 2 (kv, score), width]
        self.compressor_rows: dict[tuple[int, str], torch.Tensor] = {}
        self._layer_ratios = dict(layer_ratios)
        for layer_id, ratio in layer_ratios.items():
            self.window[layer_id] = torch.zeros(num_blocks, block_size, head_dim,
                                                dtype=dtype, device=device)
            if ratio == 0:
                continue
            rows = rows_per_block(block_size, ratio)
            self.entries[layer_id] = torch.zeros(num_blocks, rows, head_dim, dtype=dtype,
                                                 device=device)
            overlap = 2 if ratio == 4 else 1
            self.compressor_rows[layer_id, "kv"] = torch.zeros(
                num_blocks, block_size, 2, overlap * head_dim, dtype=torch.float32, device=device)
            if ratio == 4:
                self.index_keys[layer_id] = torch.zeros(num_blocks, rows, index_head_dim,
                                                        dtype=dtype, device=device)
                self.compressor_rows[layer_id, "index"] = torch.zeros(
                    num_blocks, block_size, 2, 2 * index_head_dim, dtype=torch.float32,
                    device=device)

    def storage(self, group: str) -> list[torch.Tensor]:
        """The tensors whose first dimension is the physical block id of `group`."""
        if group == WINDOW:
            return list(self.window.values())
        if group == COMPRESSED:
            return [*self.entries.values(), *self.index_keys.values()]
        return [rows for (layer_id, _), rows in self.compressor_rows.items()
                if STATE_GROUPS[self._layer_ratios[layer_id]] == group]

    def same_table_for_every_group(self, block_ids: list[int]) -> BlockTables:
        """One table for all groups (tests and benchmarks that give a sequence private blocks)."""
        return {group: block_ids for group in self.group_windows}

    def slots(self, block_table: torch.Tensor, positions: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Physical (block, row) of token positions, through a sequence's table of one group."""
        return block_table[positions // self.block_size], positions % self.block_size

    # ---- window group ------------------------------------------------------------------------
    def write_window(self, layer_id: int, slots: tuple[torch.Tensor, torch.Tensor],
                     kv: torch.Tensor) -> None:
        self.window[layer_id][slots[0], slots[1]] = kv

    def read_window(self, layer_id: int, slots: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.window[layer_id][slots[0], slots[1]]

    # ---- compressor-row groups ---------------------------------------------------------------
    def write_rows(self, key: tuple[int, str], block_table: torch.Tensor, positions: torch.Tensor,
                   kv: torch.Tensor, score: torch.Tensor) -> None:
        """Store one compressor's projected rows (fp32 [n, width] each) at `positions`."""
        blocks, rows = self.slots(block_table, positions)
        self.compressor_rows[key][blocks, rows] = torch.stack([kv, score], dim=1)

    def read_rows(self, key: tuple[int, str], block_table: torch.Tensor, first_pos: int,
                  end_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of positions [first_pos, end_pos) → (kv, score) fp32 [n, width]; positions before 0
        (the block before the first, with overlap) read as kv 0 and score −inf."""
        store = self.compressor_rows[key]
        missing = max(0, -first_pos)
        positions = torch.arange(first_pos + missing, end_pos, device=block_table.device)
        blocks, rows = self.slots(block_table, positions)
        stored = store[blocks, rows]
        kv, score = stored[:, 0], stored[:, 1]
        if missing:
            width = store.shape[-1]
            kv = torch.cat([kv.new_zeros(missing, width), kv])
            score = torch.cat([score.new_full((missing, width), float("-inf")), score])
        return kv, score

    # ---- compressed group --------------------------------------------------------------------
    def _entry_slots(self, block_table: torch.Tensor, first_entry: int, count: int, ratio: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Entry j lives in the block of its last token (j+1)·ratio − 1."""
        last_tokens = (torch.arange(count, device=block_table.device) + first_entry + 1) * ratio - 1
        logical = last_tokens // self.block_size
        return block_table[logical], (last_tokens - logical * self.block_size) // ratio

    def write_entries(self, store: torch.Tensor, block_table: torch.Tensor, first_entry: int,
                      ratio: int, values: torch.Tensor) -> None:
        if values.shape[0]:
            blocks, rows = self._entry_slots(block_table, first_entry, values.shape[0], ratio)
            store[blocks, rows] = values

    def read_entries(self, store: torch.Tensor, block_table: torch.Tensor, count: int,
                     ratio: int) -> torch.Tensor:
        """Entries 0..count-1 of one sequence → [count, width]."""
        blocks, rows = self._entry_slots(block_table, 0, count, ratio)
        return store[blocks, rows]
