"""A scripted scheduler for speculative steps: the plans a scheduler would send, without one.

Each sequence joins at a given step in a given partition, prefills in chunks, then decodes with a
verify row per step: the anchor (the last bonus token), drafts, and a request for K proposals.
The drafts are the sequence's known greedy continuation corrupted at a draft index that changes
from row to row (K: none corrupted, then 0, 1, ...), so rows accept K, 0, 1, ... drafts. The
drafter's own proposals are recorded, not drafted: they are what the layouts must agree on.
A sequence that has its tokens is finished in the next plan (the drafter releases it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from services.common.step_descriptors import (GroupBlocks, NewSequence, RowResult, ScheduledRow,
                                              StepPlan, StepResult)


@dataclass(frozen=True)
class Sequence:
    seq_id: int
    partition_id: int
    prompt: tuple[int, ...]
    first_step: int
    continuation: tuple[int, ...]  # its K=0 greedy tokens (at least num_tokens + K of them)


@dataclass(frozen=True)
class Verdict:
    """What one sampled row of a sequence came back with."""

    bonus_token: int
    num_accepted: int
    proposals: tuple[int, ...]


@dataclass
class _Progress:
    slot: int
    computed: int = 0
    tokens: list[int] = field(default_factory=list)   # output tokens committed
    verdicts: list[Verdict] = field(default_factory=list)
    finished: bool = False


class SpeculativeScript:
    """Plans steps for `sequences` and records their results (`verdicts`, `tokens`)."""

    def __init__(self, sequences: list[Sequence], num_drafts: int, num_tokens: int,
                 block_groups: tuple[str, ...], blocks_per_sequence: int, chunk_size: int,
                 vocab_size: int, partition_of: Callable[[Sequence], int]) -> None:
        self._sequences = {s.seq_id: s for s in sequences}
        self._k, self._num_tokens, self._chunk = num_drafts, num_tokens, chunk_size
        self._groups, self._blocks = block_groups, blocks_per_sequence
        self._vocab_size = vocab_size
        self._partition_of = partition_of
        slots: dict[int, int] = {}
        self._progress: dict[int, _Progress] = {}
        for s in sequences:
            partition = partition_of(s)
            self._progress[s.seq_id] = _Progress(slot=slots.get(partition, 0))
            slots[partition] = slots.get(partition, 0) + 1

    @property
    def done(self) -> bool:
        return all(p.finished for p in self._progress.values())

    def verdicts(self) -> dict[int, list[Verdict]]:
        return {seq_id: p.verdicts for seq_id, p in self._progress.items()}

    def tokens(self) -> dict[int, list[int]]:
        return {seq_id: p.tokens[:self._num_tokens] for seq_id, p in self._progress.items()}

    def plan(self, step_id: int) -> StepPlan:
        new, rows, finished = [], [], []
        for seq_id, progress in self._progress.items():
            sequence = self._sequences[seq_id]
            if progress.finished or step_id < sequence.first_step:
                continue
            if len(progress.tokens) >= self._num_tokens:
                progress.finished = True
                finished.append(seq_id)
                continue
            if step_id == sequence.first_step:
                new.append(NewSequence(seq_id, self._partition_of(sequence), sequence.prompt))
            rows.append(self._row(sequence, progress))
        return StepPlan(step_id, tuple(new), tuple(rows), tuple(finished))

    def record(self, plan: StepPlan, result: StepResult) -> None:
        """The results of `plan` (a row that does not sample has none)."""
        by_seq = {row.seq_id: row for row in result.results}
        errors = [f"sequence {row.seq_id}: {row.error}" for row in result.results if row.error]
        if errors or result.error:
            raise AssertionError("; ".join(errors) or result.error)
        for row in plan.rows:
            self._record_row(row, by_seq.get(row.seq_id))

    def _row(self, sequence: Sequence, progress: _Progress) -> ScheduledRow:
        partition = self._partition_of(sequence)
        if progress.computed < len(sequence.prompt):
            start = progress.computed
            n = min(self._chunk, len(sequence.prompt) - start)
            blocks = self._all_blocks(progress) if start == 0 else ()
            last = start + n == len(sequence.prompt)
            return ScheduledRow(sequence.seq_id, start, n, new_blocks=blocks, sample=last,
                                partition_id=partition, num_proposals=self._k if last else 0)
        anchor_pos = len(sequence.prompt) + len(progress.tokens) - 1
        return ScheduledRow(sequence.seq_id, anchor_pos, 1,
                            append_token_ids=(progress.tokens[-1],), sample=True,
                            partition_id=partition,
                            draft_token_ids=self._drafts(sequence, progress, anchor_pos),
                            num_proposals=self._k)

    def _drafts(self, sequence: Sequence, progress: _Progress,
                anchor_pos: int) -> tuple[int, ...]:
        """The continuation after the anchor, corrupted at index K (none: full acceptance) in the
        first verify row, then at 0, 1, ... in the next ones."""
        first = anchor_pos + 1 - len(sequence.prompt)
        drafts = list(sequence.continuation[first:first + self._k])
        verify_rows_before = len(progress.verdicts) - 1
        wrong = (verify_rows_before - 1) % (self._k + 1)
        if wrong < len(drafts):
            drafts[wrong] = (drafts[wrong] + 1) % self._vocab_size
        return tuple(drafts)

    def _all_blocks(self, progress: _Progress) -> tuple[GroupBlocks, ...]:
        first = progress.slot * self._blocks
        ids = tuple(range(first, first + self._blocks))
        return tuple(GroupBlocks(group, 0, ids) for group in self._groups)

    def _record_row(self, row: ScheduledRow, result: RowResult | None) -> None:
        progress = self._progress[row.seq_id]
        progress.computed = row.num_computed_tokens + row.num_new_tokens
        if result is None:
            return
        progress.tokens += row.draft_token_ids[:result.num_accepted_drafts]
        progress.computed += result.num_accepted_drafts
        progress.tokens.append(result.sampled_token_id)
        progress.verdicts.append(Verdict(result.sampled_token_id, result.num_accepted_drafts,
                                         tuple(result.proposed_token_ids)))

    def plans(self, max_steps: int = 100) -> Iterator[StepPlan]:
        """The plans of steps 0, 1, ... until every sequence finished (record each result before
        asking for the next plan)."""
        for step_id in range(max_steps):
            if self.done:
                return
            yield self.plan(step_id)
        raise AssertionError(f"not done after {max_steps} steps")
