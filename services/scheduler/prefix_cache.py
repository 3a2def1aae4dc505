"""The scheduler's side of prefix caching: content hashes of requests' blocks, lookups when a
request starts a sequence (with their hit counters), publishing after confirmed steps.

Block i's hash is sha256(hash of block i−1 ‖ token ids of block i as little-endian uint32), so it
names the whole prefix up to the end of block i. The chain starts from a root hash of everything
else that decides what a block's cache rows hold: the model fingerprint (config and checkpoint),
the compute dtype and the block size. A hit always leaves at least `min_tokens_to_compute` tokens
to compute (1: the last prompt token's logits are needed; DSpark needs 128 to rebuild its drafter
context).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from services.scheduler.kv_cache import NO_PREFIX, CachedPrefix, KvCacheManager
from services.scheduler.requests import Request


def root_hash(model_fingerprint: str, compute_dtype: str, block_size: int) -> bytes:
    return hashlib.sha256(f"dsv4serve prefix cache\n{model_fingerprint}\n{compute_dtype}\n"
                          f"{block_size}".encode()).digest()


def chain_hash(parent: bytes, token_ids: list[int]) -> bytes:
    return hashlib.sha256(parent + np.asarray(token_ids, dtype="<u4").tobytes()).digest()


@dataclass(frozen=True)
class PrefixCachePolicy:
    enabled: bool
    root: bytes
    min_tokens_to_compute: int = 1


@dataclass
class PrefixCacheStats:
    """Tokens looked up and tokens served from the cache when sequences started (vLLM counts
    queries and hits in tokens); a restart after preemption is not a query."""

    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass
class PrefixCache:
    kv: KvCacheManager
    policy: PrefixCachePolicy
    partition_stats: dict[int, PrefixCacheStats] = field(default_factory=dict)

    def block_hashes(self, request: Request) -> list[bytes]:
        """The request's hashes, extended to every full block of its known tokens."""
        hashes, bs = request.block_hashes, self.kv.block_size
        for i in range(len(hashes), request.num_tokens // bs):
            parent = hashes[i - 1] if i else self.policy.root
            hashes.append(chain_hash(parent, request.tokens_in_range(i * bs, (i + 1) * bs)))
        return hashes

    def lookup(self, request: Request, partition_id: int) -> CachedPrefix:
        """The longest cached prefix the request may start from in the partition."""
        if not self.policy.enabled:
            return NO_PREFIX
        max_blocks = (request.num_tokens - self.policy.min_tokens_to_compute) // self.kv.block_size
        return self.kv.find_cached_prefix(partition_id, self.block_hashes(request), max_blocks)

    def record(self, request: Request, partition_id: int, cached_tokens: int) -> tuple[int, int]:
        """Count a sequence start; returns the (queries, hits) tokens it added (0, 0 after a
        preemption)."""
        if not self.policy.enabled or request.num_preemptions:
            return 0, 0
        stats = self.partition_stats.setdefault(partition_id, PrefixCacheStats())
        stats.queries += request.num_tokens
        stats.hits += cached_tokens
        return request.num_tokens, cached_tokens

    def publish(self, request: Request) -> None:
        """Publish the blocks the request's confirmed positions filled."""
        if not self.policy.enabled or request.seq_id is None:
            return
        filled = request.num_computed_tokens // self.kv.block_size
        if filled > self.kv.sequence(request.seq_id).num_published:
            self.kv.publish(request.seq_id, self.block_hashes(request),
                            request.num_computed_tokens)
