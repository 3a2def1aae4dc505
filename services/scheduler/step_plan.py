"""The step descriptor and its results as plain dataclasses, mirroring worker.proto field by field.

`worker_client.py` converts them to and from protos; everything else in the scheduler uses these.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from services.scheduler.kv_cache import BlockGroupSpec


@dataclass(frozen=True)
class NewSequence:
    """Sent once, in the first step that schedules the sequence."""

    seq_id: int
    partition_id: int
    prompt_token_ids: list[int]
    logit_bias_token_ids: list[int] = field(default_factory=list)
    logit_bias_values: list[float] = field(default_factory=list)
    request_id: str = ""  # correlation id, for the worker's logs



@dataclass(frozen=True)
class TokenMask:
    """Exactly one form is set: allowed ids (ascending) or XGrammar's int32 bitmask bytes."""

    allowed_token_ids: Optional[list[int]] = None
    bitmask: Optional[bytes] = None


@dataclass
class ScheduledRow:
    """Compute `num_new_tokens` positions from `num_computed_tokens` (worker.proto ScheduledRow)."""

    seq_id: int
    num_computed_tokens: int
    num_new_tokens: int
    append_token_ids: list[int] = field(default_factory=list)
    new_block_ids: list[int] = field(default_factory=list)
    new_window_block_ids: list[int] = field(default_factory=list)
    sample: bool = False
    mask: Optional[TokenMask] = None


@dataclass
class StepPlan:
    step_id: int
    new_sequences: list[NewSequence] = field(default_factory=list)
    rows: list[ScheduledRow] = field(default_factory=list)
    finished_seq_ids: list[int] = field(default_factory=list)
    # Routing only (not on the wire): the partition of every sequence the plan names.
    partition_of: dict[int, int] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(row.num_new_tokens for row in self.rows)

    def restricted_to(self, partition_ids: frozenset[int]) -> "StepPlan":
        """The part of the plan for a worker holding `partition_ids` (same step id)."""
        def mine(seq_id: int) -> bool:
            return self.partition_of[seq_id] in partition_ids
        return StepPlan(
            step_id=self.step_id,
            new_sequences=[s for s in self.new_sequences if s.partition_id in partition_ids],
            rows=[r for r in self.rows if mine(r.seq_id)],
            finished_seq_ids=[seq_id for seq_id in self.finished_seq_ids if mine(seq_id)],
            partition_of=self.partition_of)


@dataclass(frozen=True)
class RowResult:
    seq_id: int
    sampled_token_id: Optional[int]
    error: str = ""


@dataclass(frozen=True)
class StepResult:
    step_id: int
    results: list[RowResult]
    forward_ns: int = 0
    error: str = ""


@dataclass(frozen=True)
class WorkerDescription:
    """The facts of a worker's Describe answer the scheduler uses."""

    abi_version: int
    build_id: str
    model_fingerprint: str
    block_size: int
    vocab_size: int
    eos_token_id: int
    partition_ids: tuple[int, ...]
    block_groups: tuple[BlockGroupSpec, ...]
    max_num_batched_tokens: int
