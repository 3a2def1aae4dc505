"""Step descriptors for one cache partition → `ModelRuntime.step` calls.

The scheduler owns request state and block tables and sends diffs (a sequence's prompt once, then a
few ids per row). `PartitionExecutor` keeps the mirror a rank needs to turn those diffs into full
`SequenceChunk`s: per sequence the known tokens, how many positions are cached, the block table of
each group and the logit bias. It is the only owner of that state. A sequence that starts from a
prefix-cache hit begins with `num_cached_tokens` positions cached; its first row lists the shared
blocks (a windowed group's table gets -1 for the blocks before the hit's window: never read).

A bad row (unknown sequence, a gap in positions, blocks missing or out of range, a mask that allows
nothing) fails alone: it is not computed, its sequence's state is left as it was (but for a token
to feed: a failed row leaves none), and the other rows of the step still run (the checks are in
sequence_state.py).

The ranks of every partition receive the same plan; an executor runs only the rows and new sequences
of its own partition (`PartitionLimits.partition_id`).

Under async scheduling a row planned before its sequence's previous row was answered says
`append_last_sampled`: the executor feeds it the token that previous row sampled here. Every rank of
a partition samples every row (they all compute the same logits), so each can feed its own rows, and
the worker host passes a step to its ranks the moment it arrives: the ranks start step N+1 right
after N, with no trip through the host in between.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Protocol, Union

import torch

from services.common.step_descriptors import (NewSequence, RowResult, ScheduledRow, StepMasks,
                                              StepPlan, StepResult)
from services.worker.model.runtime import SequenceChunk, StepOutput
from services.worker.row_masks import RowError, decode_token_mask, sample_late_rows
from services.worker.sequence_state import (PartitionLimits, SequenceState, appended_tokens,
                                            check_row, check_token_ids)

# Async scheduling: blocks until the masks of this step's `mask_follows` rows arrive.
AwaitMasks = Callable[[], StepMasks]


class StepRuntime(Protocol):
    """The part of `ModelRuntime` the executor calls."""

    def step(self, chunks: list[SequenceChunk], return_logits: bool = False) -> StepOutput: ...

    def release(self, seq_id: int) -> None: ...


@dataclass(frozen=True)
class RowOutcome:
    token: Optional[int]          # the sampled (bonus) token
    error: Optional[str]
    num_accepted: int = 0         # draft tokens accepted before it
    proposals: list[int] = field(default_factory=list)


class PartitionExecutor:
    """Owns the per-sequence state of one partition and runs steps on a runtime. Not thread-safe.

    Every rank of a partition prepares the same rows (so their collectives agree) and samples them:
    they all compute the same logits, so each commits the same accepted drafts, its drafter proposes
    after the same bonus token, in the same collectives, and it knows the token a planned-ahead row
    is fed. Only the partition's TP rank 0 reports the results (rank_process.py).
    """

    def __init__(self, runtime: StepRuntime, limits: PartitionLimits) -> None:
        self._runtime = runtime
        self._limits = limits
        self._sequences: dict[int, SequenceState] = {}

    @property
    def live_seq_ids(self) -> list[int]:
        return list(self._sequences)

    def execute(self, plan: StepPlan, await_masks: Optional[AwaitMasks] = None) -> StepResult:
        """Runs this partition's part of one step (the runtime runs even when that part is empty:
        an expert-parallel world needs every rank). Row problems become row errors; a runtime
        exception propagates. When the plan's masks follow, the rank runs the forward,
        then `await_masks()`, then samples the rows whose masks followed."""
        partition_id = self._limits.partition_id
        for seq_id in plan.finished_seq_ids:
            self._drop(seq_id)
        rejected = self._admit([s for s in plan.new_sequences if s.partition_id == partition_id])
        rows = tuple(row for row in plan.rows if row.partition_id == partition_id)
        prepared: list[Union[SequenceChunk, RowError]] = [
            self._prepare_or_error(row, rejected) for row in rows]
        chunks = [item for item in prepared if isinstance(item, SequenceChunk)]
        started = time.perf_counter_ns()
        late = await_masks if plan.masks_follow else None
        outcomes = self._run(chunks, late, {row.seq_id for row in rows if row.mask_follows})
        forward_ns = time.perf_counter_ns() - started
        results = self._row_results(rows, prepared, iter(outcomes))
        self._remember_sampled(results)
        return StepResult(plan.step_id, tuple(results), forward_ns)

    def reset(self) -> None:
        """Drops every sequence (a new Step stream starts empty)."""
        for seq_id in list(self._sequences):
            self._drop(seq_id)

    def warm_up(self, num_tokens: int = 8) -> None:
        """Runs one throw-away sampled prefill so the first real step pays no first-call costs."""
        if self._sequences:
            raise RuntimeError("warm_up needs an empty executor")
        num_tokens = min(num_tokens, self._limits.block_size)
        warm_up_seq_id = 0
        chunk = SequenceChunk(seq_id=warm_up_seq_id, start_pos=0,
                              token_ids=[i % self._limits.vocab_size for i in range(num_tokens)],
                              block_tables={group: [0] for group in self._limits.block_groups},
                              sample=True)
        self._runtime.step([chunk])
        self._runtime.release(warm_up_seq_id)

    def _run(self, chunks: list[SequenceChunk], await_masks: Optional[AwaitMasks],
             late_seq_ids: set[int]) -> list[RowOutcome]:
        """What the runtime made of each chunk (`late_seq_ids`: sampled here once the masks
        came); accepted drafts join the sequence's tokens."""
        if await_masks is None:
            output = self._runtime.step(chunks)
        else:
            for chunk in chunks:
                chunk.sample = chunk.sample and chunk.seq_id not in late_seq_ids
            output = self._runtime.step(chunks, return_logits=True)
            sample_late_rows(chunks, output, await_masks(), late_seq_ids, self._limits.vocab_size)
        n = len(chunks)
        outcomes = [RowOutcome(token, error, accepted, proposals) for token, error, accepted, proposals
                    in zip(output.sampled, output.errors or [None] * n,
                           output.num_accepted or [0] * n, output.proposals or [[]] * n)]
        for chunk, outcome in zip(chunks, outcomes):
            if chunk.num_drafts and outcome.token is not None:
                self._commit_drafts(chunk, outcome.num_accepted)
        return outcomes

    def _remember_sampled(self, results: list[RowResult]) -> None:
        """Each row's sequence keeps the token it sampled; a row that sampled none (or failed)
        leaves none to feed."""
        for result in results:
            state = self._sequences.get(result.seq_id)
            if state is not None:
                state.last_sampled = result.sampled_token_id

    def _commit_drafts(self, chunk: SequenceChunk, num_accepted: int) -> None:
        state = self._sequences[chunk.seq_id]
        state.token_ids.extend(chunk.token_ids[chunk.num_known:chunk.num_known + num_accepted])
        state.num_computed_tokens += num_accepted

    def _drop(self, seq_id: int) -> None:
        # Unknown ids are fine: a sequence whose NewSequence was rejected still gets finished.
        if self._sequences.pop(seq_id, None) is not None:
            self._runtime.release(seq_id)

    def _admit(self, new_sequences: list[NewSequence]) -> dict[int, str]:
        """Registers new sequences; returns the rejected ones' errors, reported on their rows."""
        rejected: dict[int, str] = {}
        for new in new_sequences:
            try:
                self._sequences[new.seq_id] = self._new_state(new)
            except RowError as error:
                rejected[new.seq_id] = str(error)
        return rejected

    def _new_state(self, new: NewSequence) -> SequenceState:
        if new.seq_id in self._sequences:
            raise RowError(f"new sequence {new.seq_id} is already live")
        check_token_ids(new.prompt_token_ids, "prompt", self._limits)
        if new.num_cached_tokens >= max(1, len(new.prompt_token_ids)):
            raise RowError(f"new sequence {new.seq_id}: {new.num_cached_tokens} cached tokens "
                           f"leave nothing of its {len(new.prompt_token_ids)} prompt tokens to "
                           f"compute")
        return SequenceState(token_ids=list(new.prompt_token_ids),
                             num_computed_tokens=new.num_cached_tokens,
                             block_tables={group: [] for group in self._limits.block_groups},
                             logit_bias=self._logit_bias(new))

    def _logit_bias(self, new: NewSequence) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        if len(new.logit_bias_token_ids) != len(new.logit_bias_values):
            raise RowError(f"logit bias of sequence {new.seq_id} has "
                           f"{len(new.logit_bias_token_ids)} ids but "
                           f"{len(new.logit_bias_values)} values")
        if not new.logit_bias_token_ids:
            return None
        check_token_ids(new.logit_bias_token_ids, "logit bias", self._limits)
        return (torch.tensor(new.logit_bias_token_ids, dtype=torch.int64),
                torch.tensor(new.logit_bias_values, dtype=torch.float32))

    def _prepare_or_error(self, row: ScheduledRow,
                          rejected: dict[int, str]) -> Union[SequenceChunk, RowError]:
        if row.seq_id in rejected:
            return RowError(rejected[row.seq_id])
        try:
            return self._prepare(row)
        except RowError as error:
            return error

    def _prepare(self, row: ScheduledRow) -> SequenceChunk:
        """Validates the row against the sequence's state, commits the diff, returns the chunk.

        Nothing is committed when the row is invalid.
        """
        state = self._sequences.get(row.seq_id)
        if state is None:
            raise RowError(f"unknown seq_id {row.seq_id}")
        appended = appended_tokens(row, state)
        check_row(row, state, appended, self._limits)
        allowed, bitmask = (decode_token_mask(row.mask, self._limits.vocab_size)
                            if row.sample and row.mask is not None else (None, None))
        draft_masks = [decode_token_mask(mask, self._limits.vocab_size)
                       for mask in row.draft_masks]
        start, end = row.num_computed_tokens, row.num_computed_tokens + row.num_new_tokens
        state.token_ids.extend(appended)
        state.last_sampled = None
        for blocks in row.new_blocks:
            table = state.block_tables[blocks.group]
            table.extend([-1] * (blocks.first_logical_block - len(table)))
            table.extend(blocks.block_ids)
        state.num_computed_tokens = end
        return SequenceChunk(seq_id=row.seq_id, start_pos=start,
                             token_ids=state.token_ids[start:end] + list(row.draft_token_ids),
                             block_tables={group: list(table)
                                           for group, table in state.block_tables.items()},
                             sample=row.sample,
                             allowed_token_ids=allowed,
                             token_bitmask=bitmask,
                             logit_bias=state.logit_bias if row.sample else None,
                             num_drafts=len(row.draft_token_ids),
                             draft_forced=list(row.draft_forced), draft_masks=draft_masks,
                             num_proposals=row.num_proposals)

    @staticmethod
    def _row_results(rows: tuple[ScheduledRow, ...], prepared: list[Union[SequenceChunk, RowError]],
                     outcomes: Iterator[RowOutcome]) -> list[RowResult]:
        """`outcomes` yields the runtime's outcome in chunk order, one per prepared row."""
        results: list[RowResult] = []
        for row, item in zip(rows, prepared):
            if isinstance(item, RowError):
                results.append(RowResult(row.seq_id, error=str(item)))
                continue
            outcome = next(outcomes)
            if outcome.error:
                results.append(RowResult(row.seq_id, error=outcome.error))
            elif row.sample:
                results.append(RowResult(row.seq_id, sampled_token_id=outcome.token,
                                         num_accepted_drafts=outcome.num_accepted,
                                         proposed_token_ids=tuple(outcome.proposals))
                               if outcome.token is not None
                               else RowResult(row.seq_id, error="the runtime sampled no token"))
        return results
