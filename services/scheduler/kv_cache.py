"""Per-sequence block tables over the block pools of every partition.

Each partition (one DP group) has one `BlockPool` per block group the workers described. A sequence
lives in one partition and has one `BlockTable` per group. Groups with a sliding window release the
blocks that fell out of the window (docs/structure.md "Cache model"): logical block i is releasable
once `(i + 1) * block_size <= next_pos - sliding_window + 1`. Released blocks go back to the pool;
the table remembers only how many leading blocks were released (the worker keeps the stale ids and
never reads them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from services.scheduler.block_pool import BlockPool


@dataclass(frozen=True)
class BlockGroupSpec:
    name: str
    num_blocks: int
    sliding_window: int  # tokens of window kept; 0 = the whole sequence


@dataclass
class BlockTable:
    """Live block ids in logical order, after `released_prefix` released leading blocks."""

    block_ids: list[int] = field(default_factory=list)
    released_prefix: int = 0

    @property
    def num_logical_blocks(self) -> int:
        return self.released_prefix + len(self.block_ids)


@dataclass
class SequenceBlocks:
    partition_id: int
    tables: dict[str, BlockTable]


@dataclass(frozen=True)
class GroupUsage:
    group: str
    total_blocks: int
    free_blocks: int
    used_blocks: int


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class KvCacheManager:
    """Owns the pools and every sequence's block tables. Not thread-safe: the step loop owns it."""

    def __init__(self, block_size: int, partitions: dict[int, tuple[BlockGroupSpec, ...]]) -> None:
        self.block_size = block_size
        self.groups = partitions
        self._pools = {pid: {g.name: BlockPool(g.num_blocks) for g in groups}
                       for pid, groups in partitions.items()}
        self._sequences: dict[int, SequenceBlocks] = {}

    @property
    def partition_ids(self) -> list[int]:
        return sorted(self._pools)

    def sequence(self, seq_id: int) -> Optional[SequenceBlocks]:
        return self._sequences.get(seq_id)

    def fits_empty_partition(self, num_tokens: int) -> bool:
        """Whether `num_tokens` positions fit the whole-sequence groups of some empty partition."""
        need = blocks_for(num_tokens, self.block_size)
        return any(all(g.num_blocks >= need for g in groups if g.sliding_window == 0)
                   for groups in self.groups.values())

    def blocks_needed(self, seq_id: int, partition_id: int, num_tokens: int) -> dict[str, int]:
        """New blocks per group for the sequence to cover positions [0, num_tokens)."""
        need = blocks_for(num_tokens, self.block_size)
        seq = self._sequences.get(seq_id)
        if seq is None:
            return {name: need for name in self._pools[partition_id]}
        return {name: max(0, need - table.num_logical_blocks) for name, table in seq.tables.items()}

    def can_allocate(self, seq_id: int, partition_id: int, num_tokens: int) -> bool:
        pools = self._pools[partition_id]
        needed = self.blocks_needed(seq_id, partition_id, num_tokens)
        return all(pools[name].can_allocate(n) for name, n in needed.items())

    def allocate(self, seq_id: int, partition_id: int, num_tokens: int) -> dict[str, list[int]]:
        """Extend the sequence's tables to cover [0, num_tokens); returns the new ids per group."""
        pools = self._pools[partition_id]
        needed = self.blocks_needed(seq_id, partition_id, num_tokens)
        seq = self._sequences.get(seq_id)
        if seq is None:
            seq = SequenceBlocks(partition_id, {name: BlockTable() for name in pools})
            self._sequences[seq_id] = seq
        new_ids: dict[str, list[int]] = {}
        for name, count in needed.items():
            new_ids[name] = pools[name].allocate(count) if count else []
            seq.tables[name].block_ids.extend(new_ids[name])
        return new_ids

    def release_outside_window(self, seq_id: int, next_pos: int) -> int:
        """Free window blocks no query from `next_pos` on can read; returns how many were freed."""
        seq = self._sequences.get(seq_id)
        if seq is None:
            return 0
        released = 0
        for group in self.groups[seq.partition_id]:
            if group.sliding_window == 0:
                continue
            table = seq.tables[group.name]
            dead = max(0, (next_pos - group.sliding_window + 1) // self.block_size)
            count = min(len(table.block_ids), dead - table.released_prefix)
            if count > 0:
                self._pools[seq.partition_id][group.name].free(table.block_ids[:count])
                del table.block_ids[:count]
                table.released_prefix += count
                released += count
        return released

    def free(self, seq_id: int) -> None:
        seq = self._sequences.pop(seq_id, None)
        if seq is None:
            return
        for name, table in seq.tables.items():
            self._pools[seq.partition_id][name].free(table.block_ids)

    def usage(self, partition_id: int) -> list[GroupUsage]:
        return [GroupUsage(name, pool.num_blocks, pool.num_free, pool.num_used)
                for name, pool in self._pools[partition_id].items()]

    def sequence_ids(self) -> Iterable[int]:
        return self._sequences.keys()

    def check_integrity(self) -> None:
        """Every pool is consistent and its used blocks are exactly those in some table."""
        for pid, pools in self._pools.items():
            for name, pool in pools.items():
                pool.check_integrity()
                in_tables = [b for s in self._sequences.values() if s.partition_id == pid
                             for b in s.tables[name].block_ids]
                assert len(in_tables) == len(set(in_tables)), f"{name}@{pid}: a block in two tables"
                assert len(in_tables) == pool.num_used, (
                    f"{name}@{pid}: {pool.num_used} used blocks but {len(in_tables)} in tables")
