"""Physical blocks of one block group in one partition: a free list and the set of used ids.

The pool only hands out and takes back ids; which request holds which block is `kv_cache.py`'s
business. Prefix caching will add reference counts and a hash index here (cached-but-free blocks).
"""
from __future__ import annotations


class BlockPoolError(Exception):
    """An id freed twice, or an id that this pool never handed out."""


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        # Popped from the end: low ids first, so a fresh pool hands out 0, 1, 2, ...
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def can_allocate(self, count: int) -> bool:
        return count <= len(self._free)

    def allocate(self, count: int) -> list[int]:
        """Take `count` free blocks; raises BlockPoolError when fewer are free (check first)."""
        if count > len(self._free):
            raise BlockPoolError(f"asked for {count} blocks, {len(self._free)} free")
        taken = [self._free.pop() for _ in range(count)]
        self._used.update(taken)
        return taken

    def free(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            if block_id not in self._used:
                raise BlockPoolError(f"block {block_id} freed but not in use")
            self._used.remove(block_id)
            self._free.append(block_id)

    def check_integrity(self) -> None:
        """free + used == total, disjoint, ids in range; raises AssertionError naming the fault."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block id is on the free list twice"
        assert not free & self._used, f"blocks both free and used: {sorted(free & self._used)[:8]}"
        assert len(free) + len(self._used) == self.num_blocks, (
            f"free {len(free)} + used {len(self._used)} != total {self.num_blocks}")
        assert all(0 <= b < self.num_blocks for b in free | self._used), "block id out of range"
