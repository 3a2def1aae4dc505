"""One `Generate` call to the scheduler: the request built from a `GenerationSpec`, its admission
and its events read back as dataclasses, cancellation and the graceful stop's cut-off."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Optional

import grpc

from services.common.pb.dsv4serve.v1 import scheduler_pb2
from services.frontend.scheduler_errors import RequestTimedOut, SchedulerError
from services.frontend.scheduler_values import (Admission, Finish, FinishReason, GenerationEvent,
                                                GenerationSpec, TokenBatch)


def generate_request_to_proto(spec: GenerationSpec) -> scheduler_pb2.GenerateRequest:
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
