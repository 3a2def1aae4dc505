"""One Step stream as the worker host reads it under async scheduling.

The scheduler may send step N+1 before step N is answered, and a masks message after a step whose
rows' masks follow. `StepInbox` reads the stream in its own task: steps queue up in order (the
servicer hands them to the ranks in that order), masks resolve the future that the ranks' command
thread waits on. When the stream ends, every step still waiting for masks gets an empty set (its
late rows fail; nobody reads their answers).

A row that says `append_last_sampled` is fed by the ranks themselves (executor.py), so the host
passes each step on as it arrives.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from typing import AsyncIterator, Optional

from services.common.pb.dsv4serve.v1 import worker_pb2
from services.common.step_descriptors import StepMasks
from services.common.step_protos import is_masks_message, masks_from_proto


class StepInbox:
    def __init__(self, requests: AsyncIterator[worker_pb2.StepRequest]) -> None:
        self._requests = requests
        self._steps: asyncio.Queue[Optional[worker_pb2.StepRequest]] = asyncio.Queue()
        self._masks: dict[int, concurrent.futures.Future] = {}
        self._last_finished_step = 0  # masks of a step this old come too late: dropped
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="step inbox")

    async def steps(self) -> AsyncIterator[worker_pb2.StepRequest]:
        """The stream's steps in order, until it ends (a read error ends it too)."""
        while (request := await self._steps.get()) is not None:
            yield request

    def masks_of(self, step_id: int) -> concurrent.futures.Future:
        """Resolves to the step's StepMasks (waited on in the ranks' command thread)."""
        return self._masks.setdefault(step_id, concurrent.futures.Future())

    def forget(self, step_id: int) -> None:
        """The step is over: answered, failed, or given up by a cancelled call (then the ranks'
        command thread may still wait for its masks: it gets an empty set)."""
        future = self._masks.pop(step_id, None)
        if future is not None and not future.done():
            future.set_result(StepMasks(step_id))
        self._last_finished_step = max(self._last_finished_step, step_id)

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        self._release_waiters()

    async def _read(self) -> None:
        try:
            async for request in self._requests:
                if is_masks_message(request):
                    self._deliver(masks_from_proto(request))
                else:
                    self._steps.put_nowait(request)
        finally:
            self._steps.put_nowait(None)
            self._release_waiters()

    def _deliver(self, masks: StepMasks) -> None:
        if masks.step_id <= self._last_finished_step:
            return
        future = self.masks_of(masks.step_id)
        if not future.done():
            future.set_result(masks)

    def _release_waiters(self) -> None:
        for step_id, future in self._masks.items():
            if not future.done():
                future.set_result(StepMasks(step_id))
