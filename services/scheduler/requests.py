"""One generation request as the scheduler tracks it, and the events it streams to its caller.

State machine: GRAMMAR_PENDING → WAITING → RUNNING → FINISHED, and RUNNING → WAITING on preemption
(the request then restarts as a new worker sequence whose prompt is prompt + outputs so far, from
the longest cached prefix of those tokens).
The step loop is the only writer of a `Request`; the servicer only reads the events it is sent.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from services.scheduler.errors import ErrorKind


class RequestPhase(enum.Enum):
    GRAMMAR_PENDING = 1
    WAITING = 2
    RUNNING = 3
    FINISHED = 4


class FinishReason(enum.Enum):
    STOP = 1
    LENGTH = 2
    ABORT = 3


@dataclass(frozen=True)
class ConstraintSpec:
    """What a constrained request may generate: `kind` is "structural_tag", "json_schema" or
    "json_object"; `spec` the grammar text (ignored for json_object)."""

    kind: str
    spec: str


@dataclass(frozen=True)
class GenerateParams:
    """A Generate call after proto conversion, before admission."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: Optional[int]
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    constraint: Optional[ConstraintSpec] = None
    # The caller's correlation id (gRPC metadata `x-request-id`), logged here and by the workers;
    # empty: the request id serves.
    correlation_id: str = ""


@dataclass(frozen=True)
class AdmittedEvent:
    prompt_tokens: int
    max_tokens: int
    constrained: bool
    max_tokens_capped: bool


@dataclass(slots=True)
class TokensEvent:
    """Treated as immutable, but not frozen: one is built per running request per step, and a
    frozen dataclass's __init__ takes twice as long (~0.5 µs against ~0.25 µs here)."""

    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class FinishedEvent:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    hit_max_model_len: bool


@dataclass(frozen=True)
class FailedEvent:
    """Ends the stream with an error status (a rejection when it comes before `AdmittedEvent`)."""

    kind: ErrorKind
    message: str
    retry_after_s: Optional[int] = None  # set on back-pressure refusals


RequestEvent = Union[AdmittedEvent, TokensEvent, FinishedEvent, FailedEvent]
EventSink = Callable[[RequestEvent], None]


@dataclass
class SpecStats:
    """One request's speculation so far (the state RPC shows it)."""

    verify_rows: int = 0        # rows that carried drafts
    drafted_tokens: int = 0     # proposals verified by the target
    accepted_tokens: int = 0    # of those, accepted
    forced_tokens: int = 0      # grammar-forced drafts (accepted with their prefix)


@dataclass(eq=False)
class Request:
    """A live request. `seq_*` fields describe its current worker sequence (reset on preemption)."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    logit_bias: tuple[tuple[int, float], ...]
    ignore_eos: bool
    constraint: Optional[ConstraintSpec]
    emit: EventSink
    arrival: int  # admission order; FCFS ties and "youngest first" victim choice use it
    phase: RequestPhase = RequestPhase.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # Grammar matcher (RequestMatcher) while the request holds one; None otherwise.
    matcher: Optional[Any] = None
    # Makes a fresh matcher of the request's compiled grammar: a constrained request preempted
    # under `--preempt-constrained replay` gives its matcher up and rebuilds it on resume.
    matcher_factory: Optional[Callable[[], Any]] = None
    grammar_status: str = "none"
    # The cache partition it was assigned on arrival (it keeps it when preempted).
    partition_id: Optional[int] = None
    # Current worker sequence: None while it has none (waiting, finished).
    seq_id: Optional[int] = None
    num_computed_tokens: int = 0
    # Tokens of this sequence the worker already knows (NewSequence prompt + appended outputs).
    num_known_tokens: int = 0
    num_preemptions: int = 0
    correlation_id: str = ""  # see GenerateParams
    # Chained content hashes of the full blocks of prompt + outputs known so far (prefix_cache.py).
    block_hashes: list[bytes] = field(default_factory=list)
    # Positions of the current sequence that came from the prefix cache.
    num_cached_tokens: int = 0
    # Speculative decoding (draft_window.py): the drafter's last proposals, for positions from
    # `proposals_from` on; dropped whenever the sequence ends.
    proposed_token_ids: list[int] = field(default_factory=list)
    proposals_from: int = 0
    spec: "SpecStats" = field(default_factory=lambda: SpecStats())

    @property
    def constrained(self) -> bool:
        return self.constraint is not None

    @property
    def needs_matcher_replay(self) -> bool:
        """Constrained, and its matcher was given up at a preemption."""
        return self.constrained and self.matcher is None and self.matcher_factory is not None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def tokens_in_range(self, start: int, end: int) -> list[int]:
        """Token ids of positions [start, end) of prompt + outputs."""
        prompt_len = len(self.prompt_token_ids)
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len:end - prompt_len]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - prompt_len]

    def clear_proposals(self) -> None:
        self.proposed_token_ids = []
        self.proposals_from = 0

    def release_matcher(self) -> None:
        if self.matcher is not None:
            self.matcher.release()
            self.matcher = None
