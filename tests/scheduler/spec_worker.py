"""A simulated target + drafter for speculative scheduling tests and benchmarks (no model).

The target is greedy and deterministic: unmasked it takes `next_token` of the prefix; masked, the
first `preferred` token the mask allows (closing values, so calls end), else `next_token` when
allowed, else an allowed token picked by a hash of the prefix. It verifies a row's drafts exactly as the worker does (verification.py). The
drafter is an oracle: it proposes the target's own continuation, walked through a scratch copy of
the request's grammar (so constrained drafts are right too), with each proposal corrupted when
`corrupt(seq_position)` says so.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from services.common.step_descriptors import RowResult, StepPlan, StepResult, TokenMask
from services.scheduler.draft_window import matcher_mask
from services.scheduler.scheduler import Scheduler
from services.worker.model.verification import sampled_offsets, verify
from tests.scheduler.fake_worker import next_token

VOCAB = 129280


def allowed_ids(mask: Optional[TokenMask]) -> Optional[np.ndarray]:
    if mask is None:
        return None
    if mask.allowed_token_ids:
        return np.array(mask.allowed_token_ids)
    if mask.refused_token_ids:
        return np.setdiff1d(np.arange(VOCAB), mask.refused_token_ids)
    words = np.frombuffer(mask.bitmask, dtype="<u4")
    bits = np.unpackbits(words.view(np.uint8), bitorder="little").astype(bool)
    return np.flatnonzero(bits[:VOCAB])


class SimulatedTarget:
    def __init__(self, preferred: tuple[int, ...] = (), eos_after: Optional[int] = None,
                 eos_token_id: int = 1) -> None:
        self.preferred = preferred
        self.eos_after = eos_after
        self.eos_token_id = eos_token_id

    def pick(self, prefix: list[int], allowed: Optional[np.ndarray]) -> int:
        if self.eos_after is not None and prefix[-1] == self.eos_after:
            wanted = self.eos_token_id
        else:
            wanted = next_token(prefix)
        if allowed is None:
            return wanted
        for token in self.preferred:
            if token in allowed:
                return token
        if wanted in allowed:
            return wanted
        return int(allowed[sum(prefix[-8:]) % len(allowed)])


class SpeculativeSimWorker:
    """Answers plans like a worker with a drafter; counts the target passes it ran."""

    def __init__(self, scheduler: Scheduler, target: SimulatedTarget,
                 corrupt: Callable[[int], bool] = lambda position: False,
                 matcher_of: Callable[[Any], Any] = lambda request: None) -> None:
        self.scheduler = scheduler
        self.target = target
        self.corrupt = corrupt
        self.matcher_of = matcher_of  # request → a fresh matcher of its grammar (oracle drafts)
        self.steps = 0

    def run(self, plan: StepPlan) -> StepResult:
        self.steps += bool(plan.rows)  # a plan may only tell the workers what finished
        results = [self._row(row) for row in plan.rows if row.sample]
        return StepResult(plan.step_id, tuple(results))

    def _row(self, row) -> RowResult:
        request = self.scheduler.request_for_seq(row.seq_id)
        end = row.num_computed_tokens + row.num_new_tokens
        known = request.tokens_in_range(0, end)
        drafts = list(row.draft_token_ids)
        forced = list(row.draft_forced) or [False] * len(drafts)
        masks = [row.mask, *row.draft_masks] if row.mask is not None else None
        offsets = sampled_offsets(len(drafts), forced)

        def sample_at(offset: int) -> int:
            mask = masks[offsets.index(offset)] if masks is not None else None
            return self.target.pick(known + drafts[:offset], allowed_ids(mask))
        verdict = verify(drafts, forced, sample_at)
        committed = known + drafts[:verdict.num_accepted] + [verdict.bonus_token]
        return RowResult(row.seq_id, verdict.bonus_token, num_accepted_drafts=verdict.num_accepted,
                         proposed_token_ids=tuple(self._propose(request, committed,
                                                                row.num_proposals)))

    def _propose(self, request, committed: list[int], count: int) -> list[int]:
        matcher = owned = self.matcher_of(request) if request.constrained else None
        try:
            if matcher is not None:
                for token in committed[len(request.prompt_token_ids):]:
                    if matcher.is_terminated():
                        return []
                    matcher.accept(token)
            tokens = list(committed)
            for _ in range(count):
                allowed = None
                if matcher is not None:
                    if matcher.is_terminated():
                        break
                    allowed = allowed_ids(matcher_mask(matcher))
                token = self.target.pick(tokens, allowed)
                if self.corrupt(len(tokens)):
                    token = (token + 1) % VOCAB
                if matcher is not None and not matcher.accept(token):
                    matcher = None  # the drafter went off the grammar: it guesses on unmasked
                tokens.append(token)
            return tokens[len(committed):]
        finally:
            if owned is not None:
                owned.release()


def run_until_idle(scheduler: Scheduler, worker: SpeculativeSimWorker, max_steps: int = 5000
                   ) -> int:
    for _ in range(max_steps):
        plan = scheduler.schedule()
        if plan is None:
            return worker.steps
        scheduler.commit(plan, worker.run(plan))
        scheduler.kv.check_integrity()
    raise AssertionError(f"still busy after {max_steps} steps")
