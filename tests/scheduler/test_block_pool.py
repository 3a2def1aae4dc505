"""Block pool and per-sequence block tables: allocation, release, window release, integrity;
reference counts, published blocks and their LRU eviction; prefix lookups across block groups."""
from __future__ import annotations

import pytest

from services.scheduler.block_pool import BlockPool, BlockPoolError
from services.scheduler.kv_cache import NO_PREFIX, BlockGroupSpec, KvCacheManager
from services.scheduler.prefix_cache import chain_hash


def hashes_of(tokens: list[int], block_size: int = 4) -> list[bytes]:
    out: list[bytes] = []
    for i in range(len(tokens) // block_size):
        out.append(chain_hash(out[-1] if out else b"root", tokens[i * block_size:(i + 1) * block_size]))
    return out


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
        pool._never_cached.append(pool._never_cached[0])  # simulate an allocator bug
        with pytest.raises(AssertionError, match="twice"):
            pool.check_integrity()


class TestCachedBlocks:
    def test_published_blocks_stay_cached_when_freed_and_can_be_shared_again(self):
        pool = BlockPool(4)
        block = pool.allocate(1)[0]
        assert pool.publish(block, b"h")
        pool.free([block])
        assert (pool.num_free, pool.num_cached, pool.lookup(b"h")) == (4, 1, block)
        pool.share(block)
        assert (pool.num_free, pool.ref_count(block)) == (3, 1)
        pool.share(block)
        pool.free([block])
        assert pool.ref_count(block) == 1 and not pool.is_evictable(block)
        pool.check_integrity()

    def test_never_cached_blocks_are_allocated_before_evicting_cached_ones(self):
        pool = BlockPool(3)
        cached = pool.allocate(1)[0]
        pool.publish(cached, b"h")
        pool.free([cached])
        assert cached not in pool.allocate(2)
        assert pool.lookup(b"h") == cached
        assert pool.allocate(1) == [cached]
        assert pool.lookup(b"h") is None and pool.num_cached == 0
        pool.check_integrity()

    def test_evicts_least_recently_freed_block_first(self):
        pool = BlockPool(3)
        blocks = pool.allocate(3)
        for block, name in zip(blocks, (b"a", b"b", b"c")):
            pool.publish(block, name)
        pool.free([blocks[1], blocks[2], blocks[0]])
        assert pool.allocate(1) == [blocks[1]]
        assert pool.lookup(b"b") is None and pool.lookup(b"a") == blocks[0]
        pool.check_integrity()

    def test_same_content_published_twice_keeps_the_first_block(self):
        pool = BlockPool(2)
        first, second = pool.allocate(2)
        assert pool.publish(first, b"h") and not pool.publish(second, b"h")
        pool.free([first, second])
        assert pool.num_cached == 1 and pool.lookup(b"h") == first
        pool.check_integrity()

    def test_unpublished_or_unreferenced_blocks_cannot_be_shared_or_published(self):
        pool = BlockPool(2)
        block = pool.allocate(1)[0]
        with pytest.raises(BlockPoolError):
            pool.share(block)
        pool.free([block])
        with pytest.raises(BlockPoolError):
            pool.publish(block, b"h")


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
        assert kv.allocate(1, 0, 8) == {}
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
        assert kv.blocks_needed(1, 20) == 1
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

    def test_fits_empty_partition_needs_one_window_in_windowed_groups(self):
        kv = make_kv(num_blocks=16, window_blocks=3, sliding_window=8)
        assert kv.fits_empty_partition(64)  # a query's 8-token window spans at most 3 blocks of 4
        assert not make_kv(num_blocks=16, window_blocks=2, sliding_window=8).fits_empty_partition(64)


class TestPrefixLookup:
    """Block size 4, window 8: a hit at position 12 needs compressed blocks 0..2 and window blocks
    1..2 (positions 5..11)."""

    def published_sequence(self, kv: KvCacheManager, tokens: list[int], seq_id: int = 1) -> None:
        kv.allocate(seq_id, 0, len(tokens))
        kv.publish(seq_id, hashes_of(tokens), len(tokens))

    def test_a_hit_shares_the_whole_prefix_and_the_window_before_it(self):
        kv = make_kv()
        tokens = list(range(100, 116))
        self.published_sequence(kv, tokens)
        seq = kv.sequence(1)
        prefix = kv.find_cached_prefix(0, hashes_of(tokens), max_blocks=3)
        assert prefix.num_blocks == 3
        assert prefix.block_ids["compressed"] == tuple(seq.tables["compressed"].block_ids[:3])
        assert prefix.first_block["window"] == 1
        assert prefix.block_ids["window"] == tuple(seq.tables["window"].block_ids[1:3])
        kv.check_integrity()

    def test_a_hit_ends_where_the_tokens_diverge(self):
        kv = make_kv()
        tokens = list(range(100, 116))
        self.published_sequence(kv, tokens)
        other = tokens[:9] + [7] + tokens[10:]
        assert kv.find_cached_prefix(0, hashes_of(other), max_blocks=4).num_blocks == 2

    def test_hash_chain_names_the_whole_prefix(self):
        """B starts like A and continues like C: only its first block is cached (C's second block
        holds the same tokens after a different first block)."""
        kv = make_kv()
        a, c = list(range(100, 116)), list(range(200, 216))
        self.published_sequence(kv, a, seq_id=1)
        self.published_sequence(kv, c, seq_id=2)
        b = a[:4] + c[4:]
        assert kv.find_cached_prefix(0, hashes_of(b), max_blocks=3).num_blocks == 1

    def test_unconfirmed_blocks_are_not_published(self):
        kv = make_kv()
        tokens = list(range(100, 116))
        kv.allocate(1, 0, 16)
        kv.publish(1, hashes_of(tokens), num_computed_tokens=7)  # only block 0 is full
        assert kv.find_cached_prefix(0, hashes_of(tokens), max_blocks=4).num_blocks == 1
        assert [u.cached_blocks for u in kv.usage(0)] == [1, 1]

    def test_a_hit_needs_the_window_blocks_before_it(self):
        """Window blocks released and then evicted: the hit falls back to a boundary whose window
        is still cached (here none beyond the start, as every window block was evicted)."""
        kv = make_kv(num_blocks=16, window_blocks=6)
        tokens = list(range(100, 124))
        self.published_sequence(kv, tokens)
        kv.release_outside_window(1, 24)   # window blocks 0..3 become evictable
        kv.free(1)
        kv.allocate(2, 0, 24)              # takes all six window blocks: evicts every cached one
        prefix = kv.find_cached_prefix(0, hashes_of(tokens), max_blocks=5)
        assert prefix is NO_PREFIX
        kv.check_integrity()

    def test_released_window_blocks_stay_hittable_until_evicted(self):
        kv = make_kv()
        tokens = list(range(100, 124))
        self.published_sequence(kv, tokens)
        kv.release_outside_window(1, 24)
        kv.free(1)
        assert kv.find_cached_prefix(0, hashes_of(tokens), max_blocks=5).num_blocks == 5
        assert all(u.used_blocks == 0 for u in kv.usage(0))

    def test_hits_are_per_partition(self):
        kv = make_kv()
        tokens = list(range(100, 116))
        self.published_sequence(kv, tokens)
        assert kv.find_cached_prefix(1, hashes_of(tokens), max_blocks=3) is NO_PREFIX

    def test_a_sequence_started_from_a_hit_holds_shared_blocks_and_sends_them_once(self):
        kv = make_kv()
        tokens = list(range(100, 116))
        self.published_sequence(kv, tokens)
        prefix = kv.find_cached_prefix(0, hashes_of(tokens), max_blocks=3)
        assert kv.tokens_that_fit_start(0, prefix, 4) == 4
        kv.start(2, 0, prefix)
        kv.allocate(2, 0, 16)
        unsent = kv.take_unsent(2)
        assert unsent["compressed"][0] == 0 and len(unsent["compressed"][1]) == 4
        assert unsent["window"][0] == 1 and len(unsent["window"][1]) == 3
        assert kv.take_unsent(2) == {}
        kv.check_integrity()
        kv.free(1)
        kv.free(2)
        assert all(u.used_blocks == 0 for u in kv.usage(0))
        kv.check_integrity()
