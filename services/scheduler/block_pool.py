"""Physical blocks of one block group in one partition: reference counts, the content hashes of
published blocks, and the free blocks.

A block is referenced while some sequence's table holds it (several may share a published block).
A free block is either never-cached (no content worth keeping) or evictable: published, so a later
prefix-cache hit may take it back, until an allocation needs room and evicts the least recently
freed one (its hash is forgotten then). Allocation takes never-cached blocks first. Which request
holds which block is `kv_cache.py`'s business.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional


class BlockPoolError(Exception):
    """An id freed while unreferenced, or more blocks asked for than are free."""


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._refs = [0] * num_blocks
        # Popped from the end: low ids first, so a fresh pool hands out 0, 1, 2, ...
        self._never_cached: list[int] = list(range(num_blocks - 1, -1, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take (never-cached plus evictable)."""
        return len(self._never_cached) + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks referenced by some sequence."""
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Published blocks (referenced or evictable)."""
        return len(self._hash_of)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def can_allocate(self, count: int) -> bool:
        return count <= self.num_free

    def allocate(self, count: int) -> list[int]:
        """Take `count` free blocks, evicting the least recently freed cached ones when the
        never-cached blocks run out; raises BlockPoolError when fewer are free (check first)."""
        if count > self.num_free:
            raise BlockPoolError(f"asked for {count} blocks, {self.num_free} free")
        taken = []
        for _ in range(count):
            if self._never_cached:
                block = self._never_cached.pop()
            else:
                block, _ = self._evictable.popitem(last=False)
                del self._block_of[self._hash_of.pop(block)]
            self._refs[block] = 1
            taken.append(block)
        return taken

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference from each block, in order: the first to become free is evicted
        first."""
        for block in block_ids:
            if not 0 <= block < self.num_blocks or self._refs[block] == 0:
                raise BlockPoolError(f"block {block} freed but not in use")
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._hash_of:
                    self._evictable[block] = None
                else:
                    self._never_cached.append(block)

    def lookup(self, block_hash: bytes) -> Optional[int]:
        """The published block with this content hash, referenced or evictable."""
        return self._block_of.get(block_hash)

    def share(self, block: int) -> None:
        """One more reference to a published block (an evictable one stops being free)."""
        if block not in self._hash_of:
            raise BlockPoolError(f"block {block} is not a published block")
        if self._refs[block] == 0:
            del self._evictable[block]
        self._refs[block] += 1

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def publish(self, block: int, block_hash: bytes) -> bool:
        """Index a referenced, filled block under its content hash. False (nothing changes) when
        that content is already cached in another block or the block already has a hash."""
        if self._refs[block] == 0:
            raise BlockPoolError(f"block {block} published while not in use")
        if block_hash in self._block_of or block in self._hash_of:
            return False
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block
        return True

    def check_integrity(self) -> None:
        """Free lists and reference counts agree, hashes index both ways; raises AssertionError
        naming the fault."""
        never, evictable = set(self._never_cached), set(self._evictable)
        assert len(never) == len(self._never_cached), "a block id is on the free list twice"
        assert not never & evictable, f"blocks free twice: {sorted(never & evictable)[:8]}"
        free = never | evictable
        referenced = {b for b in range(self.num_blocks) if self._refs[b] > 0}
        assert not free & referenced, f"blocks free and used: {sorted(free & referenced)[:8]}"
        assert len(free) + len(referenced) == self.num_blocks, (
            f"free {len(free)} + used {len(referenced)} != total {self.num_blocks}")
        assert all(b in self._hash_of for b in evictable), "an evictable block has no hash"
        assert not never & set(self._hash_of), "a never-cached free block has a hash"
        assert all(self._block_of[h] == b for b, h in self._hash_of.items()), "hash index broken"
        assert len(self._block_of) == len(self._hash_of), "hash index broken"
