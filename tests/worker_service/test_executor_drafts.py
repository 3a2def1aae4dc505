"""Rows with speculative tokens in the executor: drafts checked against their flags and masks,
accepted drafts joining the sequence's known tokens, proposals and release passed through."""
from __future__ import annotations

from dataclasses import dataclass, field

from services.common.step_descriptors import NewSequence, ScheduledRow, StepPlan, TokenMask
from services.worker.executor import PartitionExecutor
from services.worker.model.runtime import SequenceChunk, StepOutput
from tests.worker_service.test_executor import LIMITS, PROMPT, prefill_row


@dataclass
class AcceptingRuntime:
    """Accepts the first `accept` drafts of every row, samples 9, proposes [5, 6]."""

    accept: int = 0
    chunks: list[SequenceChunk] = field(default_factory=list)
    released: list[int] = field(default_factory=list)

    def step(self, chunks: list[SequenceChunk], return_logits: bool = False) -> StepOutput:
        self.chunks += chunks
        n = len(chunks)
        return StepOutput(sampled=[9] * n, logits=[None] * n, errors=[None] * n,
                          num_accepted=[min(self.accept, c.num_drafts) for c in chunks],
                          proposals=[[5, 6][:c.num_proposals] for c in chunks])

    def release(self, seq_id: int) -> None:
        self.released.append(seq_id)


def started(runtime: AcceptingRuntime) -> PartitionExecutor:
    executor = PartitionExecutor(runtime, LIMITS)
    executor.execute(StepPlan(1, [NewSequence(1, 0, PROMPT)],
                              [prefill_row(1, (0, 1, 2), num_proposals=2)]))
    return executor


def verify_row(start: int, drafts: tuple[int, ...], **fields) -> ScheduledRow:
    return ScheduledRow(seq_id=1, num_computed_tokens=start, num_new_tokens=1,
                        append_token_ids=(9,), sample=True, draft_token_ids=drafts, **fields)


def test_accepted_drafts_join_the_known_tokens_and_proposals_come_back():
    runtime = AcceptingRuntime(accept=2)
    executor = started(runtime)
    result = executor.execute(StepPlan(2, rows=[verify_row(6, (5, 6, 7), num_proposals=2)]))
    row = result.results[0]
    assert (row.sampled_token_id, row.num_accepted_drafts, row.proposed_token_ids) == (9, 2, (5, 6))
    assert runtime.chunks[-1].token_ids == [9, 5, 6, 7]
    nxt = executor.execute(StepPlan(3, rows=[verify_row(9, ())]))  # 6 + anchor + 2 accepted
    assert not nxt.results[0].error and runtime.chunks[-1].token_ids == [9]


def test_a_forced_first_draft_or_a_missing_mask_fails_only_that_row():
    executor = started(AcceptingRuntime())
    forced_first = verify_row(6, (5, 6), draft_forced=(True, False))
    assert "first draft cannot be forced" in executor.execute(
        StepPlan(2, rows=[forced_first])).results[0].error
    mask = TokenMask(allowed_token_ids=(5, 9))
    short = verify_row(6, (5, 6), mask=mask, draft_masks=(mask,))
    assert "1 draft masks for 2 sampled" in executor.execute(
        StepPlan(3, rows=[short])).results[0].error
    ok = verify_row(6, (5, 6), mask=mask, draft_masks=(mask, mask))
    assert not executor.execute(StepPlan(4, rows=[ok])).results[0].error


def test_finishing_a_sequence_releases_its_drafter_state():
    runtime = AcceptingRuntime()
    executor = started(runtime)
    executor.execute(StepPlan(2, finished_seq_ids=[1]))
    assert runtime.released == [1]
