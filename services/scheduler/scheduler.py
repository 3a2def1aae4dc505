"""Scheduling policy: each partition's queues, one step's plan, and committing its results.

vLLM-v1 style: every running request catches its computed tokens up to its total (prompt + outputs);
a long catch-up is chunked by `long_prefill_token_threshold` and the step budget
`max_num_batched_tokens`; a request whose catch-up reaches its last token samples one token. Every
partition (DP group) is scheduled on its own, with the whole budget (see partitions.py); one step's
plan carries the rows of every partition.

A new sequence starts from the longest prefix of its tokens found in the partition's prefix cache
(prefix_cache.py); blocks are published once the workers confirmed the step that filled them.
Cache pressure is handled as memory_pressure.py describes: evict cached blocks, preempt the youngest
unconstrained request by recompute, constrained requests wait (or are replayed, opt-in); when
nothing in a partition can progress for `stall_timeout_s`, the youngest blocked request there is
rejected with RESOURCE_EXHAUSTED.

Synchronous and single-owner: only the step loop calls it. The clock is injectable for tests.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Union

from services.common.step_descriptors import ScheduledRow, StepPlan, TokenMask
from services.scheduler.errors import ErrorKind
from services.scheduler.in_flight import InFlightRows, row_after
from services.scheduler.kv_cache import CachedPrefix, KvCacheManager
from services.scheduler.limits import SchedulerCounters, SchedulingLimits
from services.scheduler.memory_pressure import pick_victim, rebuild_matcher, stalled_victim
from services.scheduler.partitions import PartitionQueues, choose_partition
from services.scheduler.prefix_cache import PrefixCache, PrefixCachePolicy
from services.scheduler.requests import (FailedEvent, FinishedEvent, FinishReason, Request,
                                         RequestPhase)
from services.scheduler.speculation import first_row, speculating, speculative_row
from services.scheduler.step_results import StepResults
from services.scheduler.step_rows import grammar_mask, new_sequence, scheduled_row

_FAILED = object()  # sentinel of _mask_or_fail: the request was failed


class Scheduler(StepResults):
    def __init__(self, limits: SchedulingLimits, kv: KvCacheManager,
                 counters: Optional[SchedulerCounters] = None,
                 clock: Callable[[], float] = time.monotonic,
                 prefix_policy: PrefixCachePolicy = PrefixCachePolicy(False, b"")) -> None:
        self.limits = limits
        self.kv = kv
        self.prefix = PrefixCache(kv, prefix_policy)
        # Passed in so totals survive a new Scheduler after the workers reconnect.
        self.counters = counters if counters is not None else SchedulerCounters()
        self.partitions = {pid: PartitionQueues(pid) for pid in kv.partition_ids}
        self._clock = clock
        self._by_seq: dict[int, Request] = {}
        self._finished_seqs: list[int] = []  # dropped seq ids, until a plan tells the workers
        self._next_seq_id = 1
        self._next_step_id = 1
        self.in_flight = InFlightRows()  # planned steps not committed yet
        self._speculation_on = limits.speculation.num_speculative_tokens > 0

    # ---- queue entry and exit -------------------------------------------------------------
    @property
    def waiting(self) -> list[Request]:
        return [r for queues in self.partitions.values() for r in queues.waiting]

    @property
    def running(self) -> list[Request]:
        return [r for queues in self.partitions.values() for r in queues.running]

    def add(self, request: Request) -> None:
        """Queue a new request in the partition holding the longest cached prefix of its prompt
        (among those with room to run it now), else the least loaded one."""
        queues = choose_partition(
            self.partitions, self.kv, self.limits.max_num_seqs,
            lambda pid: self.prefix.lookup(request, pid).num_blocks)
        request.phase = RequestPhase.WAITING
        request.partition_id = queues.partition_id
        queues.waiting.append(request)
        self.counters.prompt_tokens_total += len(request.prompt_token_ids)

    def request_for_seq(self, seq_id: int) -> Optional[Request]:
        return self._by_seq.get(seq_id)

    def has_work(self) -> bool:
        return bool(self._finished_seqs) or any(q.load for q in self.partitions.values())

    def abort(self, request: Request) -> None:
        self._finish(request, FinishReason.ABORT)

    def fail(self, request: Request, kind: ErrorKind, message: str) -> None:
        self._release(request)
        request.emit(FailedEvent(kind, message))

    def fail_all(self, kind: ErrorKind, message: str) -> None:
        for request in self.running + self.waiting:
            self.fail(request, kind, message)

    def forget_worker_sequences(self) -> None:
        """The workers lost every sequence (new Step stream): nothing is left to tell them."""
        self._finished_seqs.clear()

    def seconds_until_stall_deadline(self) -> Optional[float]:
        stalls = [q.stalled_since for q in self.partitions.values() if q.stalled_since is not None]
        if not stalls:
            return None
        return max(0.0, min(stalls) + self.limits.stall_timeout_s - self._clock())

    # ---- planning -------------------------------------------------------------------------
    def schedule(self) -> Optional[StepPlan]:
        """The next step's plan, or None when there is nothing to send."""
        plan = StepPlan(step_id=self._next_step_id)
        for queues in self.partitions.values():
            self._schedule_partition(queues, plan)
        plan.finished_seq_ids = self._finished_seqs
        self._finished_seqs = []
        if not plan.rows and not plan.finished_seq_ids:
            return None
        self._next_step_id += 1
        self.in_flight.record(plan)
        return plan

    def _schedule_partition(self, queues: PartitionQueues, plan: StepPlan) -> None:
        budget = self.limits.max_num_batched_tokens
        scheduled: set[int] = set()
        blocked: list[Request] = []
        preemptions_before = self.counters.preemptions_total
        in_flight = self.in_flight.newest_rows()
        for request in list(queues.running):
            if budget == 0:
                break
            if request.phase is not RequestPhase.RUNNING:
                continue  # preempted by an earlier request of this loop
            start, placeholder = row_after(request, in_flight.get(request.seq_id))
            wanted = self._num_new_tokens(request, budget, start, placeholder)
            if wanted == 0:
                continue  # its token in flight ends it, or its rows in flight cover it
            self.kv.release_outside_window(request.seq_id, request.num_computed_tokens)
            num_new = wanted if self.kv.can_allocate(request.seq_id, request.partition_id,
                                                     start + wanted) \
                else self._make_room(queues, request, wanted, scheduled, start)
            if num_new == 0:
                blocked.append(request)
                continue
            row = self._row_or_fail(request, start, placeholder, num_new, budget)
            if row is None:
                continue
            plan.rows.append(row)
            scheduled.add(request.seq_id)
            budget -= num_new + len(row.draft_token_ids)
        if not blocked and self.counters.preemptions_total == preemptions_before:
            budget = self._admit_waiting(queues, plan, budget)
        self._track_stall(queues, blocked,
                          progressed=budget < self.limits.max_num_batched_tokens)

    def _num_new_tokens(self, request: Request, budget: int, start: int,
                        placeholder: bool) -> int:
        """Positions of the request's next row from `start`; 0 when the token in flight before it
        (`placeholder`) is sure to end it."""
        total = request.num_tokens + placeholder
        if placeholder and (total - len(request.prompt_token_ids) >= request.max_tokens
                            or total >= self.limits.max_model_len):
            return 0
        num_new = total - start
        threshold = self.limits.long_prefill_token_threshold
        if 0 < threshold < num_new:
            num_new = threshold
        return min(num_new, budget)

    def _make_room(self, queues: PartitionQueues, request: Request, num_new: int,
                   scheduled: set[int], start: int) -> int:
        """Preempt others of the partition (memory_pressure.py) until `request` can cover
        `num_new` more positions from `start`; with no victim left, as many as the free blocks
        cover. Returns the positions to compute (0: blocked this step)."""
        while not self.kv.can_allocate(request.seq_id, request.partition_id, start + num_new):
            victim = pick_victim(queues, request, scheduled, self.limits.constrained_preemption)
            if victim is None:
                return self.kv.tokens_that_fit(request.seq_id, start, num_new)
            self._preempt(queues, victim)
        return num_new

    def _preempt(self, queues: PartitionQueues, request: Request) -> None:
        self._drop_sequence(request)
        queues.running.remove(request)
        request.phase = RequestPhase.WAITING
        request.num_preemptions += 1
        queues.waiting.appendleft(request)
        self.counters.preemptions_total += 1
        if request.constrained:
            request.release_matcher()  # rebuilt on resume (rebuild_matcher)
            self.counters.constrained_preemptions_total += 1

    def _admit_waiting(self, queues: PartitionQueues, plan: StepPlan, budget: int) -> int:
        """Start waiting requests while budget, max_num_seqs and blocks allow, each from its
        longest cached prefix; returns the budget left."""
        pid = queues.partition_id
        while queues.waiting and budget > 0 and len(queues.running) < self.limits.max_num_seqs:
            request = queues.waiting[0]
            prefix = self.prefix.lookup(request, pid)
            start = prefix.num_blocks * self.kv.block_size
            wanted = self._num_new_tokens(request, budget, start, False)
            num_new = self.kv.tokens_that_fit_start(pid, prefix, wanted)
            if num_new < wanted and queues.running:
                break  # wait for room rather than start a chunk the running requests squeeze
            if num_new == 0:
                self.fail(request, ErrorKind.RESOURCE_EXHAUSTED,
                          f"request {request.request_id} does not fit an empty cache partition "
                          f"({request.num_tokens} tokens)")
                continue
            if not self._resume_matcher(request):
                continue
            mask = self._mask_or_fail(request, start + num_new)
            if mask is _FAILED:
                continue
            queues.waiting.popleft()
            self._start_sequence(queues, request, prefix)
            plan.new_sequences.append(new_sequence(request))
            plan.rows.append(first_row(self.limits, self.kv, request, num_new, mask))
            budget -= num_new
        return budget

    def _resume_matcher(self, request: Request) -> bool:
        """A constrained request preempted under replay gets its matcher back; False when that
        failed (the request failed)."""
        if not request.needs_matcher_replay:
            return True
        error = rebuild_matcher(request)
        if error is not None:
            self.fail(request, ErrorKind.INTERNAL, error)
            return False
        return True

    def _start_sequence(self, queues: PartitionQueues, request: Request,
                        prefix: CachedPrefix) -> None:
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        cached = prefix.num_blocks * self.kv.block_size
        queries, hits = self.prefix.record(request, queues.partition_id, cached)
        self.counters.prefix_cache_queries_total += queries
        self.counters.prefix_cache_hits_total += hits
        self.kv.start(seq_id, queues.partition_id, prefix)
        request.phase = RequestPhase.RUNNING
        request.seq_id = seq_id
        request.num_computed_tokens = request.num_cached_tokens = cached
        request.num_known_tokens = request.num_tokens
        self._by_seq[seq_id] = request
        queues.running.append(request)

    def _row_or_fail(self, request: Request, start: int, placeholder: bool, num_new: int,
                     budget: int) -> Optional[ScheduledRow]:
        """A running request's row (with its draft window when speculating); None when the
        grammar raised (the request failed, the step goes on). A row after a token in flight gets
        its mask later (`follow_masks`)."""
        end = start + num_new
        if placeholder:
            return scheduled_row(self.kv, request, num_new, None, start=start,
                                 after_placeholder=True)
        if not self._speculation_on or not speculating(self.limits, request, end):
            mask = None if request.matcher is None else self._mask_or_fail(request, end)
            return None if mask is _FAILED else scheduled_row(self.kv, request, num_new, mask,
                                                              start=start)
        try:
            return speculative_row(self.limits, self.kv, request, num_new, budget)
        except Exception as error:  # a grammar bug must not take the batch down
            self.fail(request, ErrorKind.INTERNAL,
                      f"grammar mask failed for request {request.request_id}: {error}")
            return None

    def _mask_or_fail(self, request: Request, end: int) -> Union[TokenMask, None, object]:
        """The grammar mask when this row (up to position `end`) samples for a constrained request
        (None otherwise); _FAILED when the matcher raised: that request fails, the step goes on."""
        if request.matcher is None or end < request.num_tokens:
            return None
        try:
            return grammar_mask(request)
        except Exception as error:  # a grammar bug must not take the batch down
            self.fail(request, ErrorKind.INTERNAL,
                      f"grammar mask failed for request {request.request_id}: {error}")
            return _FAILED

    def _track_stall(self, queues: PartitionQueues, blocked: list[Request],
                     progressed: bool) -> None:
        victim = stalled_victim(queues, blocked, progressed, self._clock(),
                                self.limits.stall_timeout_s)
        if victim is None:
            return
        self.counters.stall_rejections_total += 1
        self.fail(victim, ErrorKind.RESOURCE_EXHAUSTED,
                  f"request {victim.request_id} stalled: cache partition {queues.partition_id} "
                  f"has no free blocks for it and no request there could progress for "
                  f"{self.limits.stall_timeout_s:g}s; rejected to free the cache")

    # ---- release --------------------------------------------------------------------------
    def _finish(self, request: Request, reason: FinishReason,
                hit_max_model_len: bool = False) -> None:
        self._release(request)
        request.emit(FinishedEvent(reason, len(request.prompt_token_ids),
                                   len(request.output_token_ids), hit_max_model_len))

    def _release(self, request: Request) -> None:
        """Free everything the request holds; it leaves its queues and is FINISHED."""
        queues = self.partitions.get(request.partition_id)
        if request.phase is RequestPhase.RUNNING:
            queues.running.remove(request)
            self._drop_sequence(request)
        elif request.phase is RequestPhase.WAITING and queues is not None \
                and request in queues.waiting:
            queues.waiting.remove(request)
        request.release_matcher()
        request.clear_proposals()
        request.phase = RequestPhase.FINISHED

    def _drop_sequence(self, request: Request) -> None:
        self.kv.free(request.seq_id)
        self._finished_seqs.append(request.seq_id)
        del self._by_seq[request.seq_id]
        request.clear_proposals()
        request.seq_id = None
        request.num_computed_tokens = 0
