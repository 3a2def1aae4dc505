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
from typing import Optional

from services.common.step_descriptors import ScheduledRow, StepPlan
from services.scheduler.requests import Request


# Where a request's next row starts, and whether a token still in flight precedes it (so the
# request has one token more once that is committed). A plain tuple: one is built per running
# request per step, and a NamedTuple's constructor costs ~0.3 µs more.
NextRow = tuple[int, bool]


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

    def newest_rows(self) -> dict[int, ScheduledRow]:
        """The rows of the newest uncommitted step by sequence (while planning there is at most
        one uncommitted step: the loop plans one step ahead)."""
        return self._steps[-1][1] if self._steps else {}


def row_after(request: Request, in_flight: Optional[ScheduledRow]) -> NextRow:
    """Planning starts after the request's row in flight, if any."""
    if in_flight is None:
        return request.num_computed_tokens, False
    end = in_flight.num_computed_tokens + in_flight.num_new_tokens
    return end, in_flight.sample and end == request.num_tokens   # token_wanted, inlined
