"""One step's rows, flattened: every chunk's tokens side by side, plus the addressing each needs."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChunkRows:
    """Where one sequence's chunk sits in the flat batch and in its caches."""

    seq_id: int
    row_start: int                    # first row of this chunk in the flat batch
    start_pos: int                    # positions already cached
    end_pos: int                      # start_pos + number of tokens
    # int64, logical order, one table per block group (kv_cache.py)
    block_tables: dict[str, torch.Tensor]
    device: str

    @property
    def rows(self) -> slice:
        return slice(self.row_start, self.row_start + self.end_pos - self.start_pos)

    @property
    def positions(self) -> torch.Tensor:
        return torch.arange(self.start_pos, self.end_pos, device=self.device)


@dataclass(frozen=True)
class StepBatch:
    token_ids: torch.Tensor     # int64 [T]
    positions: torch.Tensor     # int64 [T]
    chunks: tuple[ChunkRows, ...]


def build_batch(chunks: list[tuple[int, int, list[int], dict[str, list[int]]]], device: str
                ) -> StepBatch:
    """chunks: (seq_id, start_pos, token_ids, block table per group), one per row."""
    rows: list[ChunkRows] = []
    ids: list[int] = []
    positions: list[torch.Tensor] = []
    for seq_id, start_pos, token_ids, block_tables in chunks:
        rows.append(ChunkRows(
            seq_id=seq_id, row_start=len(ids), start_pos=start_pos,
            end_pos=start_pos + len(token_ids),
            block_tables={group: torch.tensor(table, dtype=torch.int64, device=device)
                          for group, table in block_tables.items()},
            device=device))
        ids.extend(token_ids)
        positions.append(torch.arange(start_pos, start_pos + len(token_ids)))
    all_positions = torch.cat(positions) if positions else torch.zeros(0, dtype=torch.int64)
    return StepBatch(token_ids=torch.tensor(ids, dtype=torch.int64, device=device),
                     positions=all_positions.to(device), chunks=tuple(rows))
