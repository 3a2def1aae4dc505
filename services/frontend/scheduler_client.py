"""Typed wrapper of the Scheduler gRPC stub: the only frontend module that sees scheduler protos.

Everything it returns is a plain dataclass. gRPC failures become `SchedulerError` carrying the HTTP
status the gateway should answer with, so the app never inspects gRPC status codes itself.
"""
from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import AsyncIterator, Optional, Protocol, Union

import grpc

from services.common import correlation
from services.common.config import TlsConfig
from services.common.grpc_channels import aio_channel
from services.common.pb.dsv4serve.v1 import scheduler_pb2, scheduler_pb2_grpc

# Trailing metadata of a back-pressure refusal (the scheduler's server.RETRY_AFTER_KEY).
RETRY_AFTER_KEY = "retry-after-s"


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


_HTTP_STATUS_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 400,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 503,
}


class SchedulerError(Exception):
    """A failed scheduler call.

    `http_status`: before admission 400 for a refused request (INVALID_ARGUMENT, RESOURCE_EXHAUSTED),
    503 when the scheduler is unreachable, 500 otherwise. After admission nothing is the client's
    fault: a lost worker or a request stalled under cache pressure is 503, anything else 500.
    `retry_after_s`: set on back-pressure refusals (the client gets it as `Retry-After`).
    """

    def __init__(self, code: grpc.StatusCode, message: str, after_admission: bool = False,
                 retry_after_s: Optional[int] = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.after_admission = after_admission
        self.retry_after_s = retry_after_s

    @property
    def http_status(self) -> int:
        status = _HTTP_STATUS_BY_CODE.get(self.code, 500)
        return 503 if self.after_admission and status == 400 else status

    @classmethod
    def from_rpc_error(cls, error: grpc.aio.AioRpcError,
                       after_admission: bool = False) -> "SchedulerError":
        return cls(error.code(), error.details() or "", after_admission,
                   _retry_after_s(error.trailing_metadata()))


class RequestTimedOut(SchedulerError):
    """The generation passed the frontend's `--request-timeout-s`: 504 (the scheduler freed it)."""

    def __init__(self, timeout_s: float, after_admission: bool) -> None:
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"the request did not finish within the server's request timeout of "
                         f"{timeout_s:g}s", after_admission)

    @property
    def http_status(self) -> int:
        return 504


def _retry_after_s(metadata: Optional[tuple]) -> Optional[int]:
    for key, value in metadata or ():
        if key == RETRY_AFTER_KEY and isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def _generate_request_to_proto(spec: GenerationSpec) -> scheduler_pb2.GenerateRequest:
    sampling = scheduler_pb2.SamplingParams(
        logit_bias=[scheduler_pb2.LogitBias(token_id=tid, bias=bias) for tid, bias in spec.logit_bias],
        ignore_eos=spec.ignore_eos,
    )
    if spec.max_tokens is not None:
        sampling.max_tokens = spec.max_tokens
    request = scheduler_pb2.GenerateRequest(
        request_id=spec.request_id, prompt_token_ids=spec.prompt_token_ids, sampling=sampling)
    if spec.constraint is not None:
        kind = scheduler_pb2.ConstraintType.Value("CONSTRAINT_TYPE_" + spec.constraint.type.name)
        request.constraint.CopyFrom(scheduler_pb2.Constraint(type=kind, spec=spec.constraint.spec))
    return request


_FINISH_REASONS = {
    scheduler_pb2.FINISH_REASON_STOP: FinishReason.STOP,
    scheduler_pb2.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    scheduler_pb2.FINISH_REASON_ABORT: FinishReason.ABORT,
}


def _event_from_proto(message: scheduler_pb2.GenerateResponse) -> GenerationEvent:
    which = message.WhichOneof("event")
    if which == "tokens":
        return TokenBatch(tuple(message.tokens.token_ids))
    if which == "finished":
        f = message.finished
        reason = _FINISH_REASONS.get(f.reason)
        if reason is None:
            raise SchedulerError(grpc.StatusCode.INTERNAL, f"scheduler sent finish reason {f.reason}")
        return Finish(reason, f.prompt_tokens, f.completion_tokens, f.hit_max_model_len)
    raise SchedulerError(grpc.StatusCode.INTERNAL, f"scheduler sent an unexpected {which!r} event")


class GenerationStream:
    """One `Generate` call: `admitted()` first, then iterate the events; `cancel()` aborts it.

    `cut_off(message)` ends it from outside (graceful stop): the call is cancelled, so the scheduler
    frees the request, and the reader gets `SchedulerError(UNAVAILABLE, message)`.
    """

    def __init__(self, call: grpc.aio.UnaryStreamCall, timeout_s: Optional[float] = None) -> None:
        self._call = call
        self._timeout_s = timeout_s
        self._cut_off_message: Optional[str] = None

    async def admitted(self) -> Admission:
        """Waits for the scheduler's verdict; raises `SchedulerError` when it refuses the request."""
        message = await self._read(after_admission=False)
        if message is None or message.WhichOneof("event") != "admitted":
            raise SchedulerError(grpc.StatusCode.INTERNAL, "scheduler did not start with `admitted`")
        a = message.admitted
        return Admission(a.prompt_tokens, a.max_tokens, a.constrained, a.max_tokens_capped)

    async def events(self) -> AsyncIterator[GenerationEvent]:
        """Token batches then one `Finish`; raises `SchedulerError` when the stream fails."""
        while True:
            message = await self._read(after_admission=True)
            if message is None:
                raise SchedulerError(grpc.StatusCode.INTERNAL, "scheduler ended the stream early",
                                     after_admission=True)
            event = _event_from_proto(message)
            yield event
            if isinstance(event, Finish):
                return

    def cancel(self) -> None:
        """Cancels the call; the scheduler aborts the request. Safe after completion."""
        self._call.cancel()

    def cut_off(self, message: str) -> bool:
        """Cancel a call still running, so that its reader fails with `message`; False when done."""
        if self._call.done():
            return False
        self._cut_off_message = message
        self._call.cancel()
        return True

    async def _read(self, after_admission: bool) -> Optional[scheduler_pb2.GenerateResponse]:
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self._timeout_s is not None:
                raise RequestTimedOut(self._timeout_s, after_admission) from None
            raise SchedulerError.from_rpc_error(error, after_admission) from None
        except asyncio.CancelledError:
            if self._cut_off_message is None or asyncio.current_task().cancelling():
                raise  # this task itself is being cancelled
            raise SchedulerError(grpc.StatusCode.UNAVAILABLE, self._cut_off_message,
                                 after_admission) from None
        return None if message is grpc.aio.EOF else message


class SchedulerClient:
    """Owns the channel to the scheduler. Create and close it inside the serving event loop.

    `request_timeout_s` becomes the deadline of every Generate call: gRPC carries it to the
    scheduler, which cancels (and so frees) the request when it passes.
    """

    def __init__(self, address: str, tls: TlsConfig = TlsConfig(),
                 request_timeout_s: Optional[float] = None) -> None:
        self._channel = aio_channel(address, tls)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._request_timeout_s = request_timeout_s

    async def close(self) -> None:
        await self._channel.close()

    def generate(self, spec: GenerationSpec, correlation_id: str = "") -> GenerationStream:
        metadata = ((correlation.METADATA_KEY, correlation_id),) if correlation_id else None
        call = self._stub.Generate(_generate_request_to_proto(spec), metadata=metadata,
                                   timeout=self._request_timeout_s)
        return GenerationStream(call, self._request_timeout_s)

    async def abort(self, request_id: str, timeout_s: float = 5.0) -> bool:
        response = await self._unary(self._stub.Abort, scheduler_pb2.AbortRequest(request_id=request_id),
                                     timeout_s)
        return response.found

    async def get_model_info(self, timeout_s: float = 5.0) -> ModelInfo:
        r = await self._unary(self._stub.GetModelInfo, scheduler_pb2.GetModelInfoRequest(), timeout_s)
        return ModelInfo(r.served_model_name, r.max_model_len, r.vocab_size, r.eos_token_id,
                         r.block_size, r.model_fingerprint, r.constrained_decoding_available)

    async def check_ready(self, timeout_s: float) -> Readiness:
        r = await self._unary(self._stub.CheckReady, scheduler_pb2.CheckReadyRequest(), timeout_s)
        workers = tuple(WorkerReadiness(w.address, w.connected, w.error, w.last_ok_age_ms)
                        for w in r.workers)
        return Readiness(r.ready, r.reason, workers)

    async def get_scheduler_state(self, timeout_s: float) -> SchedulerSnapshot:
        r = await self._unary(self._stub.GetSchedulerState, scheduler_pb2.GetSchedulerStateRequest(),
                              timeout_s)
        groups = [g for p in r.partitions for g in p.groups]
        return SchedulerSnapshot(
            num_waiting=r.num_waiting, num_running=r.num_running,
            num_grammar_pending=r.num_grammar_pending, num_live_matchers=r.num_live_matchers,
            num_constrained_running=r.num_constrained_running,
            total_blocks=sum(g.total_blocks for g in groups),
            used_blocks=sum(g.used_blocks for g in groups),
            steps_total=r.steps_total, preemptions_total=r.preemptions_total,
            stall_rejections_total=r.stall_rejections_total,
            grammar_cache_entries=r.grammar_cache_entries,
            prompt_tokens_total=r.prompt_tokens_total,
            generation_tokens_total=r.generation_tokens_total,
            partitions=tuple(PartitionStats(
                p.partition_id, p.running_requests, p.waiting_requests,
                sum(g.total_blocks for g in p.groups), sum(g.used_blocks for g in p.groups),
                sum(g.cached_blocks for g in p.groups), p.prefix_cache_queries,
                p.prefix_cache_hits) for p in r.partitions),
            prefix_cache_queries_total=r.prefix_cache_queries_total,
            prefix_cache_hits_total=r.prefix_cache_hits_total,
            constrained_preemptions_total=r.constrained_preemptions_total,
            spec_decode_num_drafts=r.spec_decode_num_drafts,
            spec_decode_num_draft_tokens=r.spec_decode_num_draft_tokens,
            spec_decode_num_accepted_tokens=r.spec_decode_num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=tuple(
                r.spec_decode_num_accepted_tokens_per_pos),
            spec_decode_num_forced_tokens=r.spec_decode_num_forced_tokens)

    @staticmethod
    async def _unary(method, request, timeout_s: float):
        try:
            return await method(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise SchedulerError.from_rpc_error(error) from None
