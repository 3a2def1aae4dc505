"""The step descriptor and its result, as plain dataclasses mirroring worker.proto field by field.

One definition for both ends: the scheduler builds `StepPlan`s and reads `StepResult`s, the worker
reads plans and builds results. `step_protos.py` converts them at the gRPC edges; nothing else sees a
proto. Descriptors carry diffs: a sequence's prompt once (`NewSequence`), then per row only the
positions to compute, the tokens committed since its last row and the blocks appended.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class NewSequence:
    """Sent once, in the first step that schedules the sequence."""

    seq_id: int
    partition_id: int
    prompt_token_ids: tuple[int, ...]
    logit_bias_token_ids: tuple[int, ...] = ()
    logit_bias_values: tuple[float, ...] = ()
    # The request's correlation id, for the worker's logs.
    request_id: str = ""
    # Positions already in blocks shared from the prefix cache; the first row starts there.
    num_cached_tokens: int = 0


@dataclass(frozen=True)
class GroupBlocks:
    """Blocks appended to a sequence's table of one block group, the first at logical index
    `first_logical_block` (beyond the table's end only on a prefix-cache hit: the windowed group's
    blocks before the hit's window are never read)."""

    group: str
    first_logical_block: int
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class TokenMask:
    """Tokens allowed at a sampled position, in one of three forms (exactly one set; an empty mask
    allows nothing): the allowed ids ascending, XGrammar bitmask bytes (ceil(vocab/32)
    little-endian int32 words), or the refused ids ascending (every other token is allowed).
    The scheduler sends the smallest (grammar.py)."""

    allowed_token_ids: tuple[int, ...] = ()
    bitmask: bytes = b""
    refused_token_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class ScheduledRow:
    """Compute `num_new_tokens` positions of sequence `seq_id` from `num_computed_tokens` on.

    Treated as immutable, but not frozen: one is built per running request per step, and a frozen
    dataclass's __init__ took 3.0 µs against 1.3 µs for this one (256 rows: 0.43 ms per step)."""

    seq_id: int
    num_computed_tokens: int
    num_new_tokens: int
    # Output tokens committed since the sequence's previous row (they extend its known tokens).
    append_token_ids: tuple[int, ...] = ()
    # Blocks appended to the sequence's tables this step, one entry per group that got any.
    new_blocks: tuple[GroupBlocks, ...] = ()
    # Sample one token from the last computed position.
    sample: bool = False
    mask: Optional[TokenMask] = None
    # The sequence's cache partition (DP group); the ranks of other partitions skip the row.
    partition_id: int = 0
    # Speculative tokens after the row's known tokens, verified in this pass (draft_window.py).
    # A forced token (grammar-forced) is accepted iff every token before it is; a drafted one iff
    # the target's masked argmax at the position before it equals it.
    draft_token_ids: tuple[int, ...] = ()
    draft_forced: tuple[bool, ...] = ()  # one per draft token; empty: none forced
    # With a mask: the masks of the sampled positions after the last known one, in order (the
    # position of every draft token followed by a drafted token, and the last position).
    draft_masks: tuple[TokenMask, ...] = ()
    # Ask the worker's drafter for this many proposals after the row's newest committed token.
    num_proposals: int = 0
    # Overlapped scheduling (planned before the previous row's answer arrived): the token the
    # sequence's previous row sampled comes before `append_token_ids`; with `mask_follows` the mask
    # comes later, in a StepMasks message, and is awaited only to sample.
    append_last_sampled: bool = False
    mask_follows: bool = False

    @property
    def end(self) -> int:
        """The position after the row's last computed (non-draft) one."""
        return self.num_computed_tokens + self.num_new_tokens


@dataclass(frozen=True)
class RowMask:
    """The mask of one `mask_follows` row; `discard`: its token is not wanted (sample unmasked,
    the answer is ignored)."""

    seq_id: int
    mask: Optional[TokenMask] = None
    discard: bool = False


@dataclass(frozen=True)
class StepMasks:
    """The masks of step `step_id`'s `mask_follows` rows, sent once that step's dependencies are
    committed (after its request, before the next step's)."""

    step_id: int
    rows: tuple[RowMask, ...] = ()

    def by_seq(self) -> dict[int, RowMask]:
        return {row.seq_id: row for row in self.rows}

    def restricted_to(self, seq_ids: set[int]) -> "StepMasks":
        return StepMasks(self.step_id, tuple(r for r in self.rows if r.seq_id in seq_ids))


@dataclass
class StepPlan:
    step_id: int
    new_sequences: list[NewSequence] = field(default_factory=list)
    rows: list[ScheduledRow] = field(default_factory=list)
    # Sequences whose worker state is dropped before the rows run, so a preempted sequence can come
    # back as new in the same step. Sent to every worker: an id a worker does not hold is ignored.
    finished_seq_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(row.num_new_tokens for row in self.rows)

    @property
    def masks_follow(self) -> bool:
        """Some row's mask comes in a later StepMasks message."""
        return any(row.mask_follows for row in self.rows)

    def restricted_to(self, partition_ids: frozenset[int]) -> "StepPlan":
        """The part of the plan for a worker holding `partition_ids` (same step id)."""
        return StepPlan(
            step_id=self.step_id,
            new_sequences=[s for s in self.new_sequences if s.partition_id in partition_ids],
            rows=[r for r in self.rows if r.partition_id in partition_ids],
            finished_seq_ids=list(self.finished_seq_ids))


@dataclass(frozen=True)
class RowResult:
    seq_id: int
    sampled_token_id: Optional[int] = None
    # Non-empty when this row failed (bad block table, empty mask); the other rows are unaffected.
    error: str = ""
    # Leading draft tokens the target accepted; `sampled_token_id` is then the bonus token after
    # them. Proposals: the drafter's guesses for the positions after the bonus token.
    num_accepted_drafts: int = 0
    proposed_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepResult:
    step_id: int
    # One per row that asked for sampling or failed, in request order.
    results: tuple[RowResult, ...] = ()
    forward_ns: int = 0
    # Non-empty when the whole step failed.
    error: str = ""


def merge_results(results: list[StepResult]) -> StepResult:
    """One result from several answers to the same step (one per worker, or per DP group leader on a
    worker): for each row the first answer carrying a token or an error wins."""
    rows: dict[int, RowResult] = {}
    for result in results:
        for row in result.results:
            known = rows.get(row.seq_id)
            if known is None or (known.sampled_token_id is None and not known.error):
                rows[row.seq_id] = row
    error = "; ".join(r.error for r in results if r.error)
    return StepResult(step_id=results[0].step_id, results=tuple(rows.values()),
                      forward_ns=max(r.forward_ns for r in results), error=error)
