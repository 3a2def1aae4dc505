"""Scheduling policy: the waiting/running queues, one step's plan, and committing its results.

vLLM-v1 style: every running request catches its computed tokens up to its total (prompt + outputs);
a long catch-up is chunked by `long_prefill_token_threshold` and the step budget
`max_num_batched_tokens`; a request whose catch-up reaches its last token samples one token.

Cache pressure: an unconstrained request is preempted by recompute (its sequence is dropped and
it re-queues with prompt + outputs as the new prompt). A constrained request is never preempted: it
waits while other work in its partition progresses; when nothing in a partition can progress for
`stall_timeout_s`, the youngest blocked request there is rejected with RESOURCE_EXHAUSTED.

Synchronous and single-owner: only the step loop calls it. The clock is injectable for tests.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Union

from services.scheduler.errors import ErrorKind
from services.scheduler.kv_cache import KvCacheManager
from services.scheduler.requests import (FailedEvent, FinishedEvent, FinishReason, Request,
                                         RequestPhase)
from services.scheduler.step_plan import (NewSequence, ScheduledRow, StepPlan, StepResult,
                                          TokenMask)
from services.scheduler.token_commit import commit_sampled_token


_FAILED = object()  # sentinel of _mask_or_fail: the request was failed


@dataclass(frozen=True)
class SchedulingLimits:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    stall_timeout_s: float
    eos_token_id: int


@dataclass
class SchedulerCounters:
    steps_total: int = 0
    preemptions_total: int = 0
    stall_rejections_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0


class Scheduler:
    def __init__(self, limits: SchedulingLimits, kv: KvCacheManager,
                 counters: Optional[SchedulerCounters] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.kv = kv
        # Passed in so totals survive a new Scheduler after the workers reconnect.
        self.counters = counters if counters is not None else SchedulerCounters()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._clock = clock
        self._by_seq: dict[int, Request] = {}
        self._finished_seqs: dict[int, int] = {}  # dropped seq id → its partition, until sent
        self._stalled_since: dict[int, float] = {}  # partition id → first step nothing progressed
        self._next_seq_id = 1
        self._next_step_id = 1

    # ---- queue entry and exit -------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.phase = RequestPhase.WAITING
        self.waiting.append(request)
        self.counters.prompt_tokens_total += len(request.prompt_token_ids)

    def request_for_seq(self, seq_id: int) -> Optional[Request]:
        return self._by_seq.get(seq_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._finished_seqs)

    def abort(self, request: Request) -> None:
        self._finish(request, FinishReason.ABORT)

    def fail(self, request: Request, kind: ErrorKind, message: str) -> None:
        self._release(request)
        request.emit(FailedEvent(kind, message))

    def fail_all(self, kind: ErrorKind, message: str) -> None:
        for request in list(self.running) + list(self.waiting):
            self.fail(request, kind, message)

    def forget_worker_sequences(self) -> None:
        """The workers lost every sequence (new Step stream): nothing is left to tell them."""
        self._finished_seqs.clear()

    def seconds_until_stall_deadline(self) -> Optional[float]:
        if not self._stalled_since:
            return None
        first = min(self._stalled_since.values())
        return max(0.0, first + self.limits.stall_timeout_s - self._clock())

    # ---- planning -------------------------------------------------------------------------
    def schedule(self) -> Optional[StepPlan]:
        """The next step's plan, or None when there is nothing to send."""
        plan = StepPlan(step_id=self._next_step_id)
        budget = self.limits.max_num_batched_tokens
        scheduled: set[int] = set()
        blocked: list[Request] = []
        preemptions_before = self.counters.preemptions_total
        for request in list(self.running):
            if budget == 0:
                break
            if request.phase is not RequestPhase.RUNNING:
                continue  # preempted by an earlier request of this loop
            self.kv.release_outside_window(request.seq_id, request.num_computed_tokens)
            num_new = self._num_new_tokens(request, budget)
            if not self._make_room(request, request.num_computed_tokens + num_new, scheduled):
                blocked.append(request)
                continue
            mask = self._mask_or_fail(request, num_new)
            if mask is _FAILED:
                continue
            plan.rows.append(self._row(request, num_new, mask))
            scheduled.add(request.seq_id)
            budget -= num_new
        if not blocked and self.counters.preemptions_total == preemptions_before:
            self._admit_waiting(plan, budget)
        self._track_stalls(blocked, {self._by_seq[row.seq_id].partition_id for row in plan.rows})
        plan.finished_seq_ids = list(self._finished_seqs)
        plan.partition_of = dict(self._finished_seqs)
        plan.partition_of.update((row.seq_id, self._by_seq[row.seq_id].partition_id)
                                 for row in plan.rows)
        self._finished_seqs = {}
        if not plan.rows and not plan.finished_seq_ids:
            return None
        self._next_step_id += 1
        return plan

    def _num_new_tokens(self, request: Request, budget: int) -> int:
        num_new = request.num_tokens - request.num_computed_tokens
        threshold = self.limits.long_prefill_token_threshold
        if 0 < threshold < num_new:
            num_new = threshold
        return min(num_new, budget)

    def _make_room(self, request: Request, num_tokens: int, scheduled: set[int]) -> bool:
        """Preempt unconstrained requests of the partition until `request` can cover
        `num_tokens`; False when it still cannot (it is blocked this step)."""
        while not self.kv.can_allocate(request.seq_id, request.partition_id, num_tokens):
            victim = self._pick_victim(request, scheduled)
            if victim is None:
                return False
            self._preempt(victim)
        return True

    def _pick_victim(self, request: Request, scheduled: set[int]) -> Optional[Request]:
        candidates = [r for r in self.running
                      if r is not request and not r.constrained
                      and r.partition_id == request.partition_id and r.seq_id not in scheduled]
        return max(candidates, key=lambda r: r.arrival, default=None)

    def _preempt(self, request: Request) -> None:
        self._drop_sequence(request)
        self.running.remove(request)
        request.phase = RequestPhase.WAITING
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        self.counters.preemptions_total += 1

    def _admit_waiting(self, plan: StepPlan, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            seq_id = self._next_seq_id
            num_new = self._num_new_tokens(request, budget)
            partition_id = next((pid for pid in self.kv.partitions_by_load()
                                 if self.kv.can_allocate(seq_id, pid, num_new)), None)
            if partition_id is None:
                if not self.running:
                    self.fail(request, ErrorKind.RESOURCE_EXHAUSTED,
                              f"request {request.request_id} does not fit an empty cache partition "
                              f"({request.num_tokens} tokens)")
                    continue
                return
            mask = self._mask_or_fail(request, num_new)
            if mask is _FAILED:
                continue
            self.waiting.popleft()
            self._next_seq_id += 1
            self._start_sequence(request, seq_id, partition_id)
            plan.new_sequences.append(self._new_sequence(request))
            plan.rows.append(self._row(request, num_new, mask))
            budget -= num_new

    def _start_sequence(self, request: Request, seq_id: int, partition_id: int) -> None:
        request.phase = RequestPhase.RUNNING
        request.seq_id = seq_id
        request.partition_id = partition_id
        request.num_computed_tokens = 0
        request.num_known_tokens = request.num_tokens
        self._by_seq[seq_id] = request
        self.running.append(request)

    @staticmethod
    def _new_sequence(request: Request) -> NewSequence:
        return NewSequence(
            seq_id=request.seq_id, partition_id=request.partition_id,
            prompt_token_ids=request.tokens_in_range(0, request.num_tokens),
            logit_bias_token_ids=[t for t, _ in request.logit_bias],
            logit_bias_values=[b for _, b in request.logit_bias],
            request_id=request.correlation_id)

    def _row(self, request: Request, num_new: int, mask: Optional[TokenMask]) -> ScheduledRow:
        start = request.num_computed_tokens
        new_ids = self.kv.allocate(request.seq_id, request.partition_id, start + num_new)
        append = request.tokens_in_range(request.num_known_tokens, request.num_tokens)
        request.num_known_tokens = request.num_tokens
        return ScheduledRow(
            seq_id=request.seq_id, num_computed_tokens=start, num_new_tokens=num_new,
            append_token_ids=append, new_block_ids=new_ids.get("compressed", []),
            new_window_block_ids=new_ids.get("window", []),
            sample=start + num_new == request.num_tokens, mask=mask)

    def _mask_or_fail(self, request: Request, num_new: int) -> Union[TokenMask, None, object]:
        """The grammar mask when this row samples for a constrained request (None otherwise);
        _FAILED when the matcher raised: that request fails, the step goes on."""
        if request.matcher is None or request.num_computed_tokens + num_new < request.num_tokens:
            return None
        try:
            row = request.matcher.mask()
        except Exception as error:  # a grammar bug must not take the batch down
            self.fail(request, ErrorKind.INTERNAL,
                      f"grammar mask failed for request {request.request_id}: {error}")
            return _FAILED
        if row.allowed_token_ids is not None:
            return TokenMask(allowed_token_ids=list(row.allowed_token_ids))
        return TokenMask(bitmask=bytes(row.bitmask))

    def _track_stalls(self, blocked: list[Request], progressed: set[int]) -> None:
        now = self._clock()
        stalled = {r.partition_id for r in blocked} - progressed
        self._stalled_since = {pid: self._stalled_since.get(pid, now) for pid in stalled}
        for pid, since in list(self._stalled_since.items()):
            if now - since < self.limits.stall_timeout_s:
                continue
            victim = max((r for r in blocked if r.partition_id == pid), key=lambda r: r.arrival)
            self.counters.stall_rejections_total += 1
            del self._stalled_since[pid]
            self.fail(victim, ErrorKind.RESOURCE_EXHAUSTED,
                      f"request {victim.request_id} stalled: cache partition {pid} has no free "
                      f"blocks for it and no request there could progress for "
                      f"{self.limits.stall_timeout_s:g}s; rejected to free the cache")

    # ---- results --------------------------------------------------------------------------
    def commit(self, plan: StepPlan, result: StepResult) -> None:
        """Advance computed tokens, commit sampled tokens, finish or fail requests."""
        self.counters.steps_total += 1
        by_seq = {r.seq_id: r for r in result.results}
        for row in plan.rows:
            request = self._by_seq.get(row.seq_id)
            if request is None:
                continue
            request.num_computed_tokens += row.num_new_tokens
            row_result = by_seq.get(row.seq_id)
            if row_result is not None and row_result.error:
                self.fail(request, ErrorKind.INTERNAL, f"worker failed the row of request "
                                                       f"{request.request_id}: {row_result.error}")
            elif row.sample:
                self._commit_sample(request, row_result)

    def _commit_sample(self, request: Request, row_result) -> None:
        if row_result is None or row_result.sampled_token_id is None:
            self.fail(request, ErrorKind.INTERNAL,
                      f"worker returned no sampled token for request {request.request_id}")
            return
        before = len(request.output_token_ids)
        outcome = commit_sampled_token(request, row_result.sampled_token_id, self.limits)
        self.counters.generation_tokens_total += len(request.output_token_ids) - before
        if outcome.error is not None:
            self.fail(request, ErrorKind.INTERNAL, outcome.error)
        elif outcome.finish is not None:
            self._finish(request, outcome.finish, outcome.hit_max_model_len)

    # ---- release --------------------------------------------------------------------------
    def _finish(self, request: Request, reason: FinishReason,
                hit_max_model_len: bool = False) -> None:
        self._release(request)
        request.emit(FinishedEvent(reason, len(request.prompt_token_ids),
                                   len(request.output_token_ids), hit_max_model_len))

    def _release(self, request: Request) -> None:
        """Free everything the request holds; it leaves both queues and is FINISHED."""
        if request.phase is RequestPhase.RUNNING:
            self.running.remove(request)
            self._drop_sequence(request)
        elif request.phase is RequestPhase.WAITING and request in self.waiting:
            self.waiting.remove(request)
        request.release_matcher()
        request.phase = RequestPhase.FINISHED

    def _drop_sequence(self, request: Request) -> None:
        self.kv.free(request.seq_id)
        self._finished_seqs[request.seq_id] = request.partition_id
        del self._by_seq[request.seq_id]
        request.seq_id = None
        request.num_computed_tokens = 0
