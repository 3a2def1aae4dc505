"""Per-sequence block tables over the block pools of every partition, with prefix caching.

Each partition (one DP group) has one `BlockPool` per block group the workers described. A sequence
lives in one partition and has one `BlockTable` per group. Groups with a sliding window release the
blocks that fell out of the window (docs/structure.md "Cache model"): logical block i is releasable
once `(i + 1) * block_size <= next_pos - sliding_window + 1`. Released blocks go back to the pool;
the table remembers only how many leading blocks it no longer holds (the worker keeps the stale ids
and never reads them).

Prefix caching (docs/prefix-caching.md): once the workers confirmed the step that filled logical
block i, its blocks are published under the chained content hash of the sequence's tokens up to
the end of block i. A new sequence whose tokens hash the same shares them read-only: the
whole-sequence groups' blocks 0..k-1 and each windowed group's blocks covering the window before
position k·block_size; it computes from there in fresh blocks, so shared blocks are never written.
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
    """Held block ids in logical order, after `released_prefix` leading blocks it does not hold
    (released, or older than a prefix hit's window)."""

    block_ids: list[int] = field(default_factory=list)
    released_prefix: int = 0

    @property
    def num_logical_blocks(self) -> int:
        return self.released_prefix + len(self.block_ids)

    def block_at(self, logical: int) -> Optional[int]:
        index = logical - self.released_prefix
        return self.block_ids[index] if 0 <= index < len(self.block_ids) else None


@dataclass
class SequenceBlocks:
    """Every group's table of one sequence covers the same `num_blocks` logical blocks."""

    partition_id: int
    tables: dict[str, BlockTable]
    num_blocks: int = 0
    num_sent: int = 0       # logical blocks the workers were told about
    num_published: int = 0  # leading logical blocks published or shared from the cache
    release_at: int = 0     # no windowed block can be released before this next position


@dataclass(frozen=True)
class GroupUsage:
    group: str
    total_blocks: int
    free_blocks: int      # allocatable: never cached, or cached and evictable
    used_blocks: int      # referenced by some sequence
    cached_blocks: int    # published (referenced or evictable)


@dataclass(frozen=True)
class CachedPrefix:
    """A prefix-cache hit in one partition: logical blocks [0, num_blocks), as published blocks per
    group; a group's ids start at logical block `first_block[group]` (0 unless windowed)."""

    num_blocks: int
    block_ids: dict[str, tuple[int, ...]]
    first_block: dict[str, int]


NO_PREFIX = CachedPrefix(0, {}, {})


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def first_needed_block(sliding_window: int, next_pos: int, block_size: int) -> int:
    """The first logical block a query at `next_pos` may read in a group."""
    if sliding_window == 0:
        return 0
    return max(0, next_pos - sliding_window + 1) // block_size


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
        """Whether `num_tokens` positions fit some empty partition: the whole-sequence groups hold
        them all, each windowed group one query's window."""
        return any(all(g.num_blocks >= self._min_blocks(g, num_tokens) for g in groups)
                   for groups in self.groups.values())

    def _min_blocks(self, group: BlockGroupSpec, num_tokens: int) -> int:
        need = blocks_for(num_tokens, self.block_size)
        if group.sliding_window == 0:
            return need
        return min(need, blocks_for(group.sliding_window - 1, self.block_size) + 1)

    # ---- prefix cache ----------------------------------------------------------------------
    def find_cached_prefix(self, partition_id: int, block_hashes: list[bytes],
                           max_blocks: int) -> CachedPrefix:
        """The longest prefix of at most `max_blocks` blocks whose every needed block is cached."""
        if max_blocks <= 0:
            return NO_PREFIX
        pools = self._pools[partition_id]
        whole = [g.name for g in self.groups[partition_id] if g.sliding_window == 0]
        limit = min(max_blocks, len(block_hashes))
        k = 0
        while k < limit and all(pools[name].lookup(block_hashes[k]) is not None
                                for name in whole):
            k += 1
        while k > 0:
            prefix = self._prefix_of(partition_id, block_hashes, k)
            if prefix is not None:
                return prefix
            k -= 1
        return NO_PREFIX

    def _prefix_of(self, partition_id: int, block_hashes: list[bytes],
                   k: int) -> Optional[CachedPrefix]:
        """The hit at k blocks, or None when a needed block of some group is not cached."""
        ids: dict[str, tuple[int, ...]] = {}
        first: dict[str, int] = {}
        for group in self.groups[partition_id]:
            pool = self._pools[partition_id][group.name]
            first[group.name] = first_needed_block(group.sliding_window, k * self.block_size,
                                                   self.block_size)
            found = [pool.lookup(h) for h in block_hashes[first[group.name]:k]]
            if None in found:
                return None
            ids[group.name] = tuple(found)
        return CachedPrefix(k, ids, first)

    def tokens_that_fit_start(self, partition_id: int, prefix: CachedPrefix, num_new: int) -> int:
        """How many of `num_new` positions after the prefix a new sequence sharing it could
        cover with the free blocks (0: none)."""
        end = None
        for name, pool in self._pools[partition_id].items():
            shared = prefix.block_ids.get(name, ())
            reclaimed = sum(1 for block in shared if pool.is_evictable(block))
            held = prefix.first_block.get(name, 0) + len(shared)
            group_end = (held + pool.num_free - reclaimed) * self.block_size
            end = group_end if end is None else min(end, group_end)
        return max(0, min(num_new, end - prefix.num_blocks * self.block_size))

    def start(self, seq_id: int, partition_id: int, prefix: CachedPrefix) -> None:
        """Create the sequence's tables, holding the prefix's shared blocks."""
        pools = self._pools[partition_id]
        tables = {}
        for name, pool in pools.items():
            shared = list(prefix.block_ids.get(name, ()))
            for block in shared:
                pool.share(block)
            tables[name] = BlockTable(shared, released_prefix=prefix.first_block.get(name, 0))
        self._sequences[seq_id] = SequenceBlocks(partition_id, tables, prefix.num_blocks,
                                                 num_published=prefix.num_blocks)

    def publish(self, seq_id: int, block_hashes: list[bytes], num_computed_tokens: int) -> None:
        """Publish the sequence's blocks that `num_computed_tokens` confirmed positions filled."""
        seq = self._sequences.get(seq_id)
        if seq is None:
            return
        full = min(num_computed_tokens // self.block_size, len(block_hashes))
        pools = self._pools[seq.partition_id]
        for logical in range(seq.num_published, full):
            for name, table in seq.tables.items():
                block = table.block_at(logical)
                if block is not None:
                    pools[name].publish(block, block_hashes[logical])
        seq.num_published = max(seq.num_published, full)

    # ---- tables ----------------------------------------------------------------------------
    def blocks_needed(self, seq_id: int, num_tokens: int) -> int:
        """New blocks (in every group) for the sequence to cover positions [0, num_tokens)."""
        seq = self._sequences.get(seq_id)
        # blocks_for, inlined: this runs twice per running request per step.
        return -(-num_tokens // self.block_size) - (seq.num_blocks if seq else 0)

    def can_allocate(self, seq_id: int, partition_id: int, num_tokens: int) -> bool:
        count = self.blocks_needed(seq_id, num_tokens)
        return count <= 0 or all(pool.can_allocate(count)
                                 for pool in self._pools[partition_id].values())

    def tokens_that_fit(self, seq_id: int, start: int, num_new: int) -> int:
        """How many of `num_new` positions from `start` the free blocks can cover (0: none)."""
        seq = self._sequences[seq_id]
        free = min(pool.num_free for pool in self._pools[seq.partition_id].values())
        return max(0, min(num_new, (seq.num_blocks + free) * self.block_size - start))

    def allocate(self, seq_id: int, partition_id: int, num_tokens: int) -> dict[str, list[int]]:
        """Extend the sequence's tables to cover [0, num_tokens); returns the new ids per group."""
        if seq_id not in self._sequences:
            self.start(seq_id, partition_id, NO_PREFIX)
        seq = self._sequences[seq_id]
        count = self.blocks_needed(seq_id, num_tokens)
        if count <= 0:
            return {}
        new_ids: dict[str, list[int]] = {}
        for name, pool in self._pools[partition_id].items():
            new_ids[name] = pool.allocate(count)
            seq.tables[name].block_ids.extend(new_ids[name])
        seq.num_blocks += count
        return new_ids

    def take_unsent(self, seq_id: int) -> dict[str, tuple[int, list[int]]]:
        """Per group with blocks the workers do not know yet: (first logical block, ids); they
        count as sent from now on."""
        seq = self._sequences[seq_id]
        if seq.num_sent == seq.num_blocks:
            return {}
        unsent = {}
        for name, table in seq.tables.items():
            first = max(seq.num_sent, table.released_prefix)
            if first < seq.num_blocks:
                unsent[name] = (first, table.block_ids[first - table.released_prefix:])
        seq.num_sent = seq.num_blocks
        return unsent

    def release_outside_window(self, seq_id: int, next_pos: int) -> int:
        """Free window blocks no query from `next_pos` on can read (published ones stay cached,
        evictable); returns how many were freed."""
        seq = self._sequences.get(seq_id)
        if seq is None or next_pos < seq.release_at:
            return 0
        released = 0
        release_at = None
        for group in self.groups[seq.partition_id]:
            if group.sliding_window == 0:
                continue
            table = seq.tables[group.name]
            dead = first_needed_block(group.sliding_window, next_pos, self.block_size)
            count = min(len(table.block_ids), dead - table.released_prefix)
            if count > 0:
                self._pools[seq.partition_id][group.name].free(table.block_ids[:count])
                del table.block_ids[:count]
                table.released_prefix += count
                released += count
            # Block r becomes releasable once next_pos ≥ (r + 1)·bs + window − 1.
            group_at = (table.released_prefix + 1) * self.block_size + group.sliding_window - 1
            release_at = group_at if release_at is None else min(release_at, group_at)
        seq.release_at = release_at or 0
        return released

    def free(self, seq_id: int) -> None:
        """Drop the sequence; its tail blocks are freed first, so they are evicted first."""
        seq = self._sequences.pop(seq_id, None)
        if seq is None:
            return
        for name, table in seq.tables.items():
            self._pools[seq.partition_id][name].free(table.block_ids[::-1])

    def usage(self, partition_id: int) -> list[GroupUsage]:
        return [GroupUsage(name, pool.num_blocks, pool.num_free, pool.num_used, pool.num_cached)
                for name, pool in self._pools[partition_id].items()]

    def sequence_ids(self) -> Iterable[int]:
        return self._sequences.keys()

    def check_integrity(self) -> None:
        """Every pool is consistent and each block's references are exactly the tables holding
        it."""
        for pid, pools in self._pools.items():
            for name, pool in pools.items():
                pool.check_integrity()
                holders: dict[int, int] = {}
                for seq in self._sequences.values():
                    if seq.partition_id == pid:
                        table = seq.tables[name].block_ids
                        assert len(table) == len(set(table)), f"{name}@{pid}: a block twice"
                        for block in table:
                            holders[block] = holders.get(block, 0) + 1
                for block in range(pool.num_blocks):
                    assert pool.ref_count(block) == holders.get(block, 0), (
                        f"{name}@{pid}: block {block} has {pool.ref_count(block)} references "
                        f"but {holders.get(block, 0)} tables hold it")
