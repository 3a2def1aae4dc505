"""Committing a step's answers to the scheduler's requests, and the masks that follow a step.

Part of `Scheduler` (its base class), split from the planning side by concern: only the step loop
calls these, after the workers answered a step.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

from services.common.step_descriptors import (RowMask, RowResult, ScheduledRow, StepMasks,
                                              StepPlan, StepResult, TokenMask)
from services.scheduler.errors import ErrorKind
from services.scheduler.in_flight import InFlightRows, token_wanted
from services.scheduler.limits import SchedulerCounters, SchedulingLimits
from services.scheduler.prefix_cache import PrefixCache
from services.scheduler.requests import Request
from services.scheduler.speculation import commit_verified_row
from services.scheduler.token_commit import commit_sampled_token


class StepResults:
    """What the planning side provides (see `Scheduler`)."""

    limits: SchedulingLimits
    counters: SchedulerCounters
    prefix: PrefixCache
    in_flight: InFlightRows
    _by_seq: dict[int, Request]
    fail: Callable[[Request, ErrorKind, str], None]
    _finish: Callable[..., None]
    _mask_or_fail: Callable[[Request, int], Union[TokenMask, None, object]]

    def commit(self, plan: StepPlan, result: StepResult) -> None:
        """Advance computed tokens, commit sampled tokens, finish or fail requests."""
        self.in_flight.settle(plan.step_id)
        self.counters.steps_total += 1
        by_seq = {r.seq_id: r for r in result.results}
        # Publishing only when a row completes a block: every commit publishes what it filled.
        block_size = self.prefix.kv.block_size
        for row in plan.rows:
            request = self._by_seq.get(row.seq_id)
            if request is None:
                continue
            row_result = by_seq.get(row.seq_id)
            accepted = row_result.num_accepted_drafts if row_result is not None else 0
            if row_result is not None and (row_result.error
                                           or accepted > len(row.draft_token_ids)):
                self._fail_row(request, row, row_result)
                continue
            computed_before = request.num_computed_tokens
            end = row.num_computed_tokens + row.num_new_tokens
            wanted = row.sample and end == request.num_tokens   # token_wanted, inlined
            request.num_computed_tokens += row.num_new_tokens + accepted
            request.num_known_tokens += accepted  # the worker appended the accepted drafts
            if request.num_computed_tokens // block_size > computed_before // block_size:
                self.prefix.publish(request)  # the worker confirmed positions filling blocks
            if wanted:
                self._commit_sample(request, row, row_result)

    def _fail_row(self, request: Request, row: ScheduledRow, row_result: RowResult) -> None:
        """The worker failed the row, or accepted more drafts than it had."""
        if row_result.error:
            message = f"worker failed the row of request {request.request_id}: {row_result.error}"
        else:
            message = (f"worker accepted {row_result.num_accepted_drafts} of "
                       f"{len(row.draft_token_ids)} drafts of request {request.request_id}")
        self.fail(request, ErrorKind.INTERNAL, message)

    def fail_step(self, plan: StepPlan, error: str) -> None:
        """The whole step failed on a worker: its requests fail."""
        self.in_flight.settle(plan.step_id)
        message = f"worker failed step {plan.step_id}: {error}"
        for row in plan.rows:
            request = self._by_seq.get(row.seq_id)
            if request is not None:
                self.fail(request, ErrorKind.INTERNAL, message)

    def follow_masks(self, plan: StepPlan) -> Optional[StepMasks]:
        """The masks of `plan`'s `mask_follows` rows, once every step before it is committed: a
        row whose token is no longer wanted (finished request, forced tokens first) is discarded."""
        rows = [self._follow_mask(row) for row in plan.rows if row.mask_follows]
        return StepMasks(plan.step_id, tuple(rows)) if rows else None

    def _follow_mask(self, row: ScheduledRow) -> RowMask:
        request = self._by_seq.get(row.seq_id)
        if request is None or not token_wanted(row, request):
            return RowMask(row.seq_id, discard=True)
        mask = self._mask_or_fail(request, row.end)
        return RowMask(row.seq_id, mask=mask) if isinstance(mask, TokenMask) \
            else RowMask(row.seq_id, discard=True)

    def _commit_sample(self, request: Request, row: ScheduledRow,
                       row_result: Optional[RowResult]) -> None:
        if row_result is None or row_result.sampled_token_id is None:
            self.fail(request, ErrorKind.INTERNAL,
                      f"worker returned no sampled token for request {request.request_id}")
            return
        before = len(request.output_token_ids)
        if row.num_proposals or row.draft_token_ids:
            outcome = commit_verified_row(request, row, row_result, self.limits,
                                          self.counters.spec,
                                          self.limits.speculation.grammar_forced_drafts)
        else:
            outcome = commit_sampled_token(request, row_result.sampled_token_id, self.limits)
        self.counters.generation_tokens_total += len(request.output_token_ids) - before
        if outcome.error is not None:
            self.fail(request, ErrorKind.INTERNAL, outcome.error)
        elif outcome.finish is not None:
            self._finish(request, outcome.finish, outcome.hit_max_model_len)
