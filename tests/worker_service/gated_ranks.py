"""A stand-in for the worker's rank group whose steps wait until the test opens a gate."""
from __future__ import annotations

import asyncio

from services.common.step_descriptors import StepPlan, StepResult


class GatedRanks:
    """Stands in for the rank group: each step waits until the test opens the gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.stepping = asyncio.Event()
        self.handed_over: list[int] = []  # step ids, in the order they reached the ranks
        self._in_flight: set[asyncio.Task] = set()

    async def reset(self) -> None:
        return None

    def hand_over(self, plan: StepPlan, masks: object = None) -> asyncio.Future:
        self.handed_over.append(plan.step_id)
        self.stepping.set()
        answered = asyncio.ensure_future(self._answer(plan))
        self._in_flight.add(answered)
        answered.add_done_callback(self._in_flight.discard)
        return answered

    async def settled(self) -> None:
        await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def _answer(self, plan: StepPlan) -> StepResult:
        await self.gate.wait()
        return StepResult(step_id=plan.step_id)
