"""What the scheduler does when a partition's blocks run out.

1. Allocation evicts cached, unreferenced blocks first (least recently freed; block_pool.py).
2. Then the youngest unconstrained request of the partition is preempted by recompute: its blocks
   are freed (published ones stay cached), and it restarts later from the longest cached prefix of
   prompt + outputs, so the recompute mostly hits the cache.
3. Constrained requests: with `--preempt-constrained wait` (the default) they are never preempted;
   they wait while others progress, and when nothing in the partition could progress for
   `stall_timeout_s` the youngest blocked request is rejected with RESOURCE_EXHAUSTED. With
   `--preempt-constrained replay` the youngest constrained request is preempted after the
   unconstrained ones: it gives its grammar matcher up and, on resume, a fresh matcher re-accepts
   its committed output tokens, so its output is exactly the unpreempted one.
When no victim is left, a request's prefill chunk shrinks to what the free blocks cover, so a
request that fits the cache alone always progresses.
"""
from __future__ import annotations

import enum
from typing import Optional

from services.scheduler.partitions import PartitionQueues
from services.scheduler.requests import Request


class ConstrainedPreemption(enum.Enum):
    WAIT = "wait"
    REPLAY = "replay"


def pick_victim(queues: PartitionQueues, request: Request, scheduled: set[int],
                constrained: ConstrainedPreemption) -> Optional[Request]:
    """The youngest running request of the partition that may be preempted for `request`: an
    unconstrained one, else (replay) a constrained one; never one already in this step."""
    candidates = [r for r in queues.running if r is not request and r.seq_id not in scheduled]
    unconstrained = [r for r in candidates if not r.constrained]
    if unconstrained:
        return max(unconstrained, key=lambda r: r.arrival)
    if constrained is ConstrainedPreemption.REPLAY:
        replayable = [r for r in candidates if r.matcher_factory is not None]
        return max(replayable, key=lambda r: r.arrival, default=None)
    return None


def stalled_victim(queues: PartitionQueues, blocked: list[Request], progressed: bool, now: float,
                   stall_timeout_s: float) -> Optional[Request]:
    """Track how long nothing in the partition could progress; after `stall_timeout_s`, the
    youngest blocked request, to be rejected (the stall clock restarts)."""
    if not blocked or progressed:
        queues.stalled_since = None
        return None
    if queues.stalled_since is None:
        queues.stalled_since = now
    if now - queues.stalled_since < stall_timeout_s:
        return None
    queues.stalled_since = None
    return max(blocked, key=lambda r: r.arrival)


def rebuild_matcher(request: Request) -> Optional[str]:
    """Give a resumed constrained request a fresh matcher that has accepted its committed output
    tokens; the error when the grammar refuses one (a bug: the same tokens were accepted once)."""
    matcher = request.matcher_factory()
    for position, token in enumerate(request.output_token_ids):
        if not matcher.accept(token):
            matcher.release()
            return (f"replaying the grammar of request {request.request_id} after preemption: "
                    f"token {token} at output position {position} was refused")
    request.matcher = matcher
    return None
