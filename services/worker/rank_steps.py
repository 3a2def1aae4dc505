"""The steps handed to the ranks' command thread, and the one sent to the ranks ahead of its turn.

Steps run on the ranks one at a time, in the order the Step stream gave them. Under async scheduling
step N+1 is handed over while N still runs; when N's answers arrive, the command thread feeds N+1
the tokens N sampled and sends it to the ranks at once, before N's answer goes back to the event
loop — so the ranks wait for no trip through the worker's event loop between two steps (answering
N first wakes the event loop, which then holds the GIL for a millisecond or more while the ranks
idle). N+1's own command then only collects its answers.

A step sent ahead whose own command never runs (its Step stream ended and the command was
withdrawn) still runs on the ranks; the next command settles it first: its masks (the ended
stream resolved them empty) and its answers, which nobody reads.
"""
from __future__ import annotations

import concurrent.futures
from collections import deque
from dataclasses import dataclass
from typing import Optional

from services.common.step_descriptors import StepPlan
from services.worker.step_stream import LastSampled


@dataclass(eq=False)
class HandedStep:
    plan: StepPlan
    masks: Optional[concurrent.futures.Future]  # resolves to the StepMasks when masks follow
    last_sampled: Optional[LastSampled]  # the Step stream's; None: rows come fed
    sent: bool = False  # the plan went to the ranks ahead of the step's own command


class HandedSteps:
    """Appended on the event loop as steps are handed over; read and popped on the command thread
    (deque appends and pops are atomic)."""

    def __init__(self) -> None:
        self._handed: deque[HandedStep] = deque()
        # Sent to the ranks, answers not collected yet: a step sent ahead, or one being collected.
        self.uncollected: Optional[HandedStep] = None

    def hand(self, step: HandedStep) -> None:
        self._handed.append(step)

    def take(self, step: HandedStep) -> None:
        """`step`'s command runs: it leaves the queue, with any withdrawn steps before it."""
        while self._handed and self._handed.popleft() is not step:
            pass

    def following(self, step: HandedStep) -> Optional[HandedStep]:
        """The step handed over after `step` in the same Step stream, if it is there already."""
        upcoming = self._handed[0] if self._handed else None
        if upcoming is None or step.last_sampled is None:
            return None
        return upcoming if upcoming.last_sampled is step.last_sampled else None
