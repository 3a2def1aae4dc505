"""Paged cache storage of one partition, addressed through the scheduler's logical block tables.

Two block groups (see docs/structure.md, "Cache model"):
- `window`: raw kv rows (`ori`) of every main layer; logical block i holds positions
  [i·bs, (i+1)·bs).
- `compressed`: compressed entries (`cmp_c4`, `cmp_c128`) and indexer keys (`idx`); logical block i
  holds the entries whose first token lies in [i·bs, (i+1)·bs), ceil(bs/ratio) rows per block.
This class owns the storage tensors only; block tables belong to the scheduler and arrive with
each chunk. It never decides which blocks are live.
"""
from __future__ import annotations

import math

import torch


def rows_per_block(block_size: int, ratio: int) -> int:
    return math.ceil(block_size / ratio)


class PagedKvCache:
    def __init__(self, layer_ratios: dict[int, int], head_dim: int, index_head_dim: int,
                 block_size: int, num_blocks: int, num_window_blocks: int, dtype: torch.dtype,
                 device: str):
        """layer_ratios: compression ratio (0, 4, 128) of every layer this cache serves."""
        self.block_size = block_size
        self.window: dict[int, torch.Tensor] = {}
        self.entries: dict[int, torch.Tensor] = {}      # cmp_c4 / cmp_c128, by layer id
        self.index_keys: dict[int, torch.Tensor] = {}   # idx, by layer id (ratio-4 layers)
        for layer_id, ratio in layer_ratios.items():
            self.window[layer_id] = torch.zeros(num_window_blocks, block_size, head_dim,
                                                dtype=dtype, device=device)
            if ratio == 0:
                continue
            rows = rows_per_block(block_size, ratio)
            self.entries[layer_id] = torch.zeros(num_blocks, rows, head_dim, dtype=dtype,
                                                 device=device)
            if ratio == 4:
                self.index_keys[layer_id] = torch.zeros(num_blocks, rows, index_head_dim,
                                                        dtype=dtype, device=device)

    def storage(self) -> list[torch.Tensor]:
        """Every tensor this cache owns (tests poison them with NaN to prove what is read)."""
        return [*self.window.values(), *self.entries.values(), *self.index_keys.values()]

    # ---- window group ------------------------------------------------------------------------
    def window_slots(self, window_block_table: torch.Tensor, positions: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Physical (block, row) of raw positions, through a sequence's window block table."""
        return window_block_table[positions // self.block_size], positions % self.block_size

    def write_window(self, layer_id: int, slots: tuple[torch.Tensor, torch.Tensor],
                     kv: torch.Tensor) -> None:
        self.window[layer_id][slots[0], slots[1]] = kv

    def read_window(self, layer_id: int, slots: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.window[layer_id][slots[0], slots[1]]

    # ---- compressed group --------------------------------------------------------------------
    def _entry_slots(self, block_table: torch.Tensor, first_entry: int, count: int, ratio: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        first_tokens = (torch.arange(count, device=block_table.device) + first_entry) * ratio
        logical = first_tokens // self.block_size
        return block_table[logical], (first_tokens - logical * self.block_size) // ratio

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
