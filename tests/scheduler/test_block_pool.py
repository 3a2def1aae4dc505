"""Block pool and per-sequence block tables: allocation, release, window release, integrity."""
from __future__ import annotations

import pytest

from services.scheduler.block_pool import BlockPool, BlockPoolError
from services.scheduler.kv_cache import BlockGroupSpec, KvCacheManager


class TestBlockPool:
    def test_allocates_distinct_blocks_until_empty(self):
        pool = BlockPool(4)
        taken = pool.allocate(3) + pool.allocate(1)
        assert sorted(taken) == [0, 1, 2, 3] and pool.num_free == 0
        assert not pool.can_allocate(1)
        with pytest.raises(BlockPoolError):
            pool.allocate(1)
        pool.check_integrity()

    def test_freed_blocks_are_reused(self):
        pool = BlockPool(2)
        first = pool.allocate(2)
        pool.free(first[:1])
        assert pool.allocate(1) == first[:1]
        pool.check_integrity()

    def test_double_free_is_refused(self):
        pool = BlockPool(2)
        block = pool.allocate(1)
        pool.free(block)
        with pytest.raises(BlockPoolError):
            pool.free(block)

    def test_integrity_check_catches_a_corrupted_free_list(self):
        pool = BlockPool(3)
        pool.allocate(1)
        pool._free.append(pool._free[0])  # simulate an allocator bug
        with pytest.raises(AssertionError, match="twice"):
            pool.check_integrity()


def make_kv(num_blocks: int = 16, window_blocks: int = 8,
            sliding_window: int = 8) -> KvCacheManager:
    groups = (BlockGroupSpec("window", window_blocks, sliding_window),
              BlockGroupSpec("compressed", num_blocks, 0))
    return KvCacheManager(4, {0: groups, 1: groups})


class TestKvCacheManager:
    def test_tables_grow_by_whole_blocks_in_every_group(self):
        kv = make_kv()
        new = kv.allocate(seq_id=1, partition_id=0, num_tokens=5)
        assert {g: len(ids) for g, ids in new.items()} == {"window": 2, "compressed": 2}
        assert kv.allocate(1, 0, 8) == {"window": [], "compressed": []}
        grown = kv.allocate(1, 0, 9)
        assert {g: len(ids) for g, ids in grown.items()} == {"window": 1, "compressed": 1}
        kv.check_integrity()

    def test_window_blocks_older_than_the_window_are_released(self):
        kv = make_kv(sliding_window=8)
        kv.allocate(1, 0, 16)  # blocks 0..3 of 4 tokens
        # The query at position 12 reads positions 5..12: block 0 ([0,4)) is dead, block 1 is not.
        assert kv.release_outside_window(1, next_pos=12) == 1
        table = kv.sequence(1).tables["window"]
        assert table.released_prefix == 1 and len(table.block_ids) == 3
        assert kv.sequence(1).tables["compressed"].released_prefix == 0
        assert kv.blocks_needed(1, 0, 20) == {"window": 1, "compressed": 1}
        kv.check_integrity()

    def test_free_returns_every_block(self):
        kv = make_kv()
        kv.allocate(1, 0, 12)
        kv.release_outside_window(1, 12)
        kv.free(1)
        assert all(u.free_blocks == u.total_blocks for u in kv.usage(0))
        kv.check_integrity()

    def test_allocation_is_refused_when_one_group_is_full(self):
        kv = make_kv(num_blocks=16, window_blocks=2)
        assert kv.can_allocate(1, 0, 8) and not kv.can_allocate(1, 0, 9)

    def test_fits_empty_partition_checks_whole_sequence_groups(self):
        kv = make_kv(num_blocks=4)
        assert kv.fits_empty_partition(16) and not kv.fits_empty_partition(17)
