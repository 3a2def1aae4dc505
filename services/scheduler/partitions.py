"""The queues of each cache partition (DP group) and the choice of a partition for a new request.

Every partition has its own waiting queue and running list, and gets the whole step budget
(`max_num_seqs`, `max_num_batched_tokens`) for itself: as in vLLM's data-parallel deployments, where
each DP engine schedules with the full limits, the limits are per partition, because each DP group
computes its own rows and its rank's buffers are sized for one group's step.

A request is assigned to a partition when it arrives and stays there (a preempted request waits in
its partition again). Prefix affinity first: among the partitions with room to run it now (load
below `max_num_seqs`), the one whose prefix cache holds the longest prefix of its prompt wins, since
only that partition's cache can serve it. Otherwise the least loaded partition wins — fewest
requests running plus waiting, then the most free blocks in its tightest group — because all groups
step in lockstep (the expert exchange joins them every layer): the busiest group sets every step's
duration, so even loads give the shortest steps, and the free-block tie-break keeps long requests
from piling into one cache. The room condition keeps a popular prefix (a shared system prompt) from
drawing every request into one partition: once it is full, the next request goes to the least
loaded one, whose cache then learns the prefix too.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from services.scheduler.kv_cache import KvCacheManager
from services.scheduler.requests import Request


@dataclass
class PartitionQueues:
    partition_id: int
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)
    # When no request here could progress for the first time in a row of steps; None otherwise.
    stalled_since: Optional[float] = None

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)


def least_loaded(partitions: dict[int, PartitionQueues], kv: KvCacheManager) -> PartitionQueues:
    def key(queues: PartitionQueues) -> tuple[int, int, int]:
        tightest_free = min(usage.free_blocks for usage in kv.usage(queues.partition_id))
        return queues.load, -tightest_free, queues.partition_id
    return min(partitions.values(), key=key)


def choose_partition(partitions: dict[int, PartitionQueues], kv: KvCacheManager,
                     max_num_seqs: int, cached_blocks: Callable[[int], int]) -> PartitionQueues:
    """The partition with room and the longest cached prefix (`cached_blocks(partition_id)`),
    ties to the least loaded; the least loaded one when no partition with room holds any."""
    fallback = least_loaded(partitions, kv)
    if len(partitions) == 1:
        return fallback
    with_room = {pid: q for pid, q in partitions.items() if q.load < max_num_seqs}
    hits = {pid: cached_blocks(pid) for pid in with_room}
    best = max(hits.values(), default=0)
    if best == 0:
        return fallback
    return least_loaded({pid: with_room[pid] for pid, n in hits.items() if n == best}, kv)
