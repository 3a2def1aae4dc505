"""Who may touch the ranks when: steps side by side, or one exclusive change.

Under async scheduling the worker hands step N+1 to its ranks' command thread as soon as it
arrives, while step N still runs, so the ranks start N+1 the moment N is done (the command thread
feeds N+1 the tokens N sampled; no trip through this event loop between the two). Steps therefore
overlap in the servicer, and a plain lock held per step no longer fits. A world change (JoinWorld),
a new Step stream's reset and a graceful stop need no step running and none starting meanwhile:
they hold the gate exclusively.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator


class StepGate:
    def __init__(self) -> None:
        self._exclusive = asyncio.Lock()
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def step_started(self) -> None:
        """Counts a step in; waits while the gate is held exclusively."""
        async with self._exclusive:
            self._running += 1
            self._idle.clear()

    def step_ended(self) -> None:
        self._running -= 1
        if not self._running:
            self._idle.set()

    async def acquire(self) -> None:
        """Exclusive: once no step runs, and no step starts until `release`."""
        await self._exclusive.acquire()
        try:
            await self._idle.wait()
        except BaseException:
            self._exclusive.release()
            raise

    def release(self) -> None:
        self._exclusive.release()

    @contextlib.asynccontextmanager
    async def exclusively(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()
