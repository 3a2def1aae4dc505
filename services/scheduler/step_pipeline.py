"""The steps the workers are working on: sending plans, committing answers, sending late masks.

Sequential (`depth` 1): plan, send, await the answer, commit, plan again. Async scheduling
(`depth` 2, vLLM's async scheduling / SGLang's overlap scheduler): while step N runs on the workers
the loop plans step N+1 from where N's rows end (in_flight.py) and sends it, so the workers start
N+1 as soon as N is done; committing N's answer, filling the grammar masks and planning N+2 overlap
N+1's forward. A row of N+1 whose mask depends on N's token says `mask_follows`; its mask is sent
(`StepMasks`) right after N is committed, and the worker awaits it only to sample.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Protocol

from services.common.config import SchedulerConfig
from services.common.step_descriptors import StepMasks, StepPlan, StepResult
from services.scheduler.limits import SchedulerCounters
from services.scheduler.scheduler import Scheduler
from services.scheduler.speculation import spec_policy


class StepExecutor(Protocol):
    """What the pipeline needs of the worker set (each raises WorkerLost)."""

    async def send(self, plan: StepPlan) -> None: ...

    async def receive(self, plan: StepPlan) -> StepResult: ...

    async def send_masks(self, plan: StepPlan, masks: StepMasks) -> None: ...


def pipeline_depth(config: SchedulerConfig) -> int:
    """Steps in flight at most: 2 with async scheduling, which is off with speculation (a draft
    window is planned from verified tokens only)."""
    speculating = spec_policy(config.speculative).num_speculative_tokens > 0
    return 2 if config.async_scheduling and not speculating else 1


class StepPipeline:
    """The steps in flight, oldest first; counts each answered step's time in `counters`."""

    def __init__(self, executor: StepExecutor, depth: int, counters: SchedulerCounters) -> None:
        self._executor = executor
        self.depth = depth
        self._counters = counters
        self._in_flight: deque[StepPlan] = deque()
        self._sent_s: deque[float] = deque()  # when each step in flight was sent
        self._last_answer_s = 0.0

    @property
    def busy(self) -> bool:
        return bool(self._in_flight)

    @property
    def has_room(self) -> bool:
        return len(self._in_flight) < self.depth

    def clear(self) -> None:
        """The workers are gone, and with them every step in flight."""
        self._in_flight.clear()
        self._sent_s.clear()

    async def send(self, plan: StepPlan) -> None:
        self._in_flight.append(plan)
        self._sent_s.append(time.perf_counter())
        await self._executor.send(plan)

    async def complete_oldest(self, scheduler: Scheduler) -> None:
        """Await the oldest step's answer and commit it; then the next step's late masks."""
        plan = self._in_flight[0]
        result = await self._executor.receive(plan)
        self._in_flight.popleft()
        self._count_time(self._sent_s.popleft(), result)
        if result.error:
            scheduler.fail_step(plan, result.error)
        else:
            scheduler.commit(plan, result)
        if self._in_flight:
            following = self._in_flight[0]
            masks = scheduler.follow_masks(following)
            if masks is not None:
                await self._executor.send_masks(following, masks)

    def _count_time(self, sent_s: float, result: StepResult) -> None:
        """The step's time from its send, or from the previous answer when it was already in
        flight then (the workers started it as soon as they were done with that one)."""
        now = time.perf_counter()
        self._counters.step_seconds_total += now - max(sent_s, self._last_answer_s)
        self._counters.worker_forward_seconds_total += result.forward_ns / 1e9
        self._last_answer_s = now
