"""What the scheduler client hands the gateway: plain dataclasses, never protos."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Protocol, Union


class ConstraintLike(Protocol):
    """What `constraints.build_constraint` returns: `type` is an enum named like the proto's values."""

    type: enum.Enum
    spec: str


@dataclass(frozen=True)
class GenerationSpec:
    """One generation request as the scheduler receives it."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: Optional[int]
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    constraint: Optional[ConstraintLike] = None


@dataclass(frozen=True)
class Admission:
    prompt_tokens: int
    max_tokens: int
    constrained: bool
    max_tokens_capped: bool


@dataclass(frozen=True)
class TokenBatch:
    token_ids: tuple[int, ...]


class FinishReason(enum.Enum):
    STOP = "stop"        # EOS (constrained: the grammar had terminated too)
    LENGTH = "length"    # max_tokens or max_model_len
    ABORT = "abort"      # aborted by Abort or a cancelled call


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    hit_max_model_len: bool


GenerationEvent = Union[TokenBatch, Finish]


@dataclass(frozen=True)
class ModelInfo:
    served_model_name: str
    max_model_len: int
    vocab_size: int
    eos_token_id: int
    block_size: int
    model_fingerprint: str
    constrained_decoding_available: bool


@dataclass(frozen=True)
class WorkerReadiness:
    address: str
    connected: bool
    error: str
    last_ok_age_ms: int


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    workers: tuple[WorkerReadiness, ...]


@dataclass(frozen=True)
class PartitionStats:
    partition_id: int
    running: int
    waiting: int
    total_blocks: int
    used_blocks: int
    cached_blocks: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@dataclass(frozen=True)
class SchedulerSnapshot:
    """The counters of `GetSchedulerState` that /metrics exports."""

    num_waiting: int
    num_running: int
    num_grammar_pending: int
    num_live_matchers: int
    num_constrained_running: int
    total_blocks: int
    used_blocks: int
    steps_total: int
    preemptions_total: int
    stall_rejections_total: int
    grammar_cache_entries: int
    prompt_tokens_total: int
    generation_tokens_total: int
    partitions: tuple[PartitionStats, ...] = ()
    prefix_cache_queries_total: int = 0
    prefix_cache_hits_total: int = 0
    constrained_preemptions_total: int = 0
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: tuple[int, ...] = ()
    spec_decode_num_forced_tokens: int = 0
    spec_decode_num_draft_tokens_per_pos: tuple[int, ...] = ()
    spec_decode_num_accepted_proposals_per_pos: tuple[int, ...] = ()
    spec_decode_num_proposal_sets: int = 0
    step_seconds_total: float = 0.0
    worker_forward_seconds_total: float = 0.0
