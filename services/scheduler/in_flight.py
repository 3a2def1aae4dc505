"""Rows the workers have been sent but whose answers the scheduler has not committed yet.

With async scheduling the step loop plans step N+1 while step N runs (step_pipeline.py). A request
with a row in N is then planned from where that row ends: its positions count as computed, and a
row that samples a token the scheduler will want leaves a placeholder for it — the next row computes
that token's position and the worker feeds it its own answer (`append_last_sampled`). A row's token
is wanted exactly when the row ends at the request's last known token once the steps before it are
committed; otherwise grammar-forced tokens came first (or the request is gone) and it is discarded.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

from services.common.step_descriptors import ScheduledRow, StepPlan
from services.scheduler.requests import Request


@dataclass(frozen=True)
class NextRow:
    """Where a request's next row starts, and whether a token still in flight precedes it."""

    start: int
    placeholder: bool

    def total(self, request: Request) -> int:
        """The request's tokens once the placeholder's token is committed."""
        return request.num_tokens + self.placeholder


def token_wanted(row: ScheduledRow, request: Request) -> bool:
    """Is the token `row` samples the request's next one (every earlier step committed)?"""
    return row.sample and row.end == request.num_tokens


class InFlightRows:
    """The rows of each planned, uncommitted step, oldest first."""

    def __init__(self) -> None:
        self._steps: deque[tuple[int, dict[int, ScheduledRow]]] = deque()

    def __len__(self) -> int:
        return len(self._steps)

    def record(self, plan: StepPlan) -> None:
        self._steps.append((plan.step_id, {row.seq_id: row for row in plan.rows}))

    def settle(self, step_id: int) -> None:
        """The step's answer was committed (or the step failed)."""
        settled, _ = self._steps.popleft()
        if settled != step_id:
            raise RuntimeError(f"step {step_id} settled while step {settled} is older")

    def next_row(self, request: Request) -> NextRow:
        """Planning starts after the newest uncommitted row of the request (there is at most one
        uncommitted step while planning: the loop plans one step ahead)."""
        row = self._newest_row(request.seq_id)
        if row is None:
            return NextRow(request.num_computed_tokens, False)
        return NextRow(row.end, token_wanted(row, request))

    def _newest_row(self, seq_id: int) -> Optional[ScheduledRow]:
        if not self._steps:
            return None
        return self._steps[-1][1].get(seq_id)
