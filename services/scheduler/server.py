"""The Scheduler gRPC service: a thin servicer over the step loop, plus health and reflection.

Health is SERVING only while every worker is connected (it flips with the worker set). Protos stop
here: the servicer converts them (`scheduler_protos.py`) and hands work to the step loop.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import AsyncIterator, Awaitable, Optional, TypeVar

import grpc

from services.common import correlation
from services.common.config import SchedulerConfig
from services.common.grpc_server import RunningServer, serve_until_signal, start_server
from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from services.common.pb.dsv4serve.v1 import scheduler_pb2_grpc
from services.scheduler.errors import ErrorKind, SchedulerError
from services.scheduler.grammar_backend import GrammarFactory, grammar_factory
from services.scheduler.requests import FailedEvent, FinishedEvent, GenerateParams, RequestEvent
from services.scheduler.scheduler_protos import (event_to_proto, params_from_proto,
                                                 request_state_to_proto, state_to_proto,
                                                 worker_status_to_proto)
from services.scheduler.step_loop import StepLoop
from services.scheduler.worker_description import WorkerDescription
from services.scheduler.worker_client import WorkerSet
from services.scheduler.worker_connection import WorkerTimeouts

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Scheduler"].full_name
T = TypeVar("T")
_STATUS = {kind: getattr(grpc.StatusCode, kind.value) for kind in ErrorKind}
# Trailing metadata of a back-pressure refusal: whole seconds after which a retry may succeed.
RETRY_AFTER_KEY = "retry-after-s"
DRAIN_POLL_S = 0.05


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, config: SchedulerConfig, loop: StepLoop, workers: WorkerSet) -> None:
        self._config = config
        self._loop = loop
        self._workers = workers

    async def Generate(self, request: pb.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        try:
            params = params_from_proto(request)
        except SchedulerError as error:
            await context.abort(_STATUS[error.kind], error.message)
        cid = correlation.from_metadata(context.invocation_metadata()) or params.request_id
        params = replace(params, correlation_id=cid)
        events: asyncio.Queue[RequestEvent] = asyncio.Queue()
        emit = events.put_nowait  # one object: `cancel` recognises this call's request by it
        self._loop.submit(params, emit)
        ended = False
        try:
            while not ended:
                event = await events.get()
                if isinstance(event, FailedEvent):
                    ended = True
                    _log_failure(params, event)
                    await context.abort(_STATUS[event.kind], event.message, _retry_metadata(event))
                ended = isinstance(event, FinishedEvent)
                if ended:
                    _log_finish(params, event)
                yield event_to_proto(event)
        finally:
            if not ended:  # the caller cancelled: abort and release everything now
                log.info("request %s: cancelled by the caller", params.request_id,
                         extra={"request_id": cid})
                self._loop.cancel(params.request_id, emit)

    async def Abort(self, request: pb.AbortRequest,
                    context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        found = await _or_abort(context, self._loop.abort(request.request_id))
        return pb.AbortResponse(found=found)

    async def GetModelInfo(self, request: pb.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> pb.GetModelInfoResponse:
        description = self._workers.description
        if description is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                "no worker has completed its handshake yet")
        grammar = self._loop.grammar
        return pb.GetModelInfoResponse(
            served_model_name=self._config.served_model_name,
            max_model_len=self._config.max_model_len, vocab_size=description.vocab_size,
            eos_token_id=description.eos_token_id, block_size=description.block_size,
            model_fingerprint=description.model_fingerprint,
            constrained_decoding_available=bool(grammar is not None and grammar.available))

    async def CheckReady(self, request: pb.CheckReadyRequest,
                         context: grpc.aio.ServicerContext) -> pb.CheckReadyResponse:
        readiness = await self._workers.check_ready()
        return pb.CheckReadyResponse(ready=readiness.ready, reason=readiness.reason,
                                     workers=[worker_status_to_proto(w) for w in readiness.workers])

    async def GetSchedulerState(self, request: pb.GetSchedulerStateRequest,
                                context: grpc.aio.ServicerContext) -> pb.GetSchedulerStateResponse:
        snapshot = await _or_abort(context, self._loop.snapshot(request.include_requests))
        return state_to_proto(snapshot, self._workers.statuses())

    async def GetRequestState(self, request: pb.GetRequestStateRequest,
                              context: grpc.aio.ServicerContext) -> pb.GetRequestStateResponse:
        snapshot = await _or_abort(context, self._loop.request_snapshot(request.request_id))
        if snapshot is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"no live request with id {request.request_id!r}")
        return request_state_to_proto(snapshot)


def _retry_metadata(event: FailedEvent) -> tuple[tuple[str, str], ...]:
    return () if event.retry_after_s is None else ((RETRY_AFTER_KEY, str(event.retry_after_s)),)


def _log_finish(params: GenerateParams, event: FinishedEvent) -> None:
    log.info("request %s: finished (%s, %d prompt + %d completion tokens)", params.request_id,
             event.reason.name.lower(), event.prompt_tokens, event.completion_tokens,
             extra={"request_id": params.correlation_id})


def _log_failure(params: GenerateParams, event: FailedEvent) -> None:
    level = logging.INFO if event.retry_after_s is not None else logging.WARNING
    log.log(level, "request %s: %s: %s", params.request_id, event.kind.value, event.message,
            extra={"request_id": params.correlation_id})


async def _or_abort(context: grpc.aio.ServicerContext, query: Awaitable[T]) -> T:
    """The query's answer, or the call ends with the status of its SchedulerError."""
    try:
        return await query
    except SchedulerError as error:
        await context.abort(_STATUS[error.kind], error.message)


@dataclass
class RunningScheduler:
    """A started scheduler: its gRPC server (bound `port`), step loop and worker set."""

    grpc: RunningServer
    loop: StepLoop
    workers: WorkerSet
    loop_task: asyncio.Task

    @property
    def port(self) -> int:
        return self.grpc.port

    async def drain(self, grace_s: float) -> None:
        """Graceful stop: refuse new requests, let live ones finish for up to `grace_s`, then fail
        the rest with UNAVAILABLE (their callers get a clear error, not a cut connection)."""
        self.loop.stop_admitting("the scheduler is shutting down; not accepting new requests")
        deadline = asyncio.get_running_loop().time() + grace_s
        live = await self.loop.num_live_requests()
        while live and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
            live = await self.loop.num_live_requests()
        if live:
            failed = await self.loop.fail_live_requests(
                f"the scheduler is shutting down; the request did not finish within the "
                f"{grace_s:g}s shutdown grace")
            log.warning("shutdown grace of %gs over: failed %d live request(s)", grace_s, failed)

    async def stop(self, grace_s: float = 1.0) -> None:
        await self.grpc.stop(grace_s)
        await self.workers.stop()
        self.loop_task.cancel()
        await asyncio.gather(self.loop_task, return_exceptions=True)
        self.loop.close()


async def start_scheduler_server(config: SchedulerConfig, *,
                                 grammar: Optional[GrammarFactory] = None,
                                 expected_fingerprint: Optional[str] = None,
                                 timeouts: WorkerTimeouts = WorkerTimeouts()) -> RunningScheduler:
    """Start serving on config.host:config.port (0: a free port, see `.port`) and start connecting
    to the workers; health turns SERVING once every worker passed the handshake."""
    loop: Optional[StepLoop] = None  # bound below; the worker callbacks run only after start()
    health_updates: set[asyncio.Task] = set()
    running_server: Optional[RunningServer] = None

    def flip_health(serving: bool) -> None:
        if running_server is not None:
            update = running_server.mark_serving() if serving else running_server.mark_not_serving()
            task = asyncio.ensure_future(update)
            health_updates.add(task)
            task.add_done_callback(health_updates.discard)

    def on_ready(description: WorkerDescription) -> None:
        loop.workers_ready(description)
        flip_health(True)

    def on_lost(reason: str) -> None:
        loop.workers_lost(reason)
        flip_health(False)

    workers = WorkerSet(config.worker_addresses, block_size=config.block_size,
                        expected_fingerprint=expected_fingerprint,
                        probe_interval_s=config.worker_probe_interval_s, timeouts=timeouts,
                        on_ready=on_ready, on_lost=on_lost, tls=config.ops.tls)
    loop = StepLoop(config, workers, grammar or grammar_factory(config))
    servicer = SchedulerServicer(config, loop, workers)
    running_server = await start_server(
        config.host, config.port, [SERVICE_NAME],
        lambda server: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server),
        tls=config.ops.tls, reflection_on=config.ops.grpc_reflection)
    loop_task = asyncio.get_running_loop().create_task(loop.run(), name="step loop")
    # A crashed step loop (logged by it) must not leave health SERVING.
    loop_task.add_done_callback(lambda task: task.cancelled() or flip_health(False))
    workers.start()
    return RunningScheduler(running_server, loop, workers, loop_task)


async def serve(config: SchedulerConfig, *, started: Optional[asyncio.Event] = None) -> None:
    """Run the scheduler until SIGINT/SIGTERM; `started` is set once it listens."""
    running = await start_scheduler_server(config)
    log.info("scheduler listening on %s:%d; workers %s", config.host, running.port,
             ", ".join(config.worker_addresses))
    if started is not None:
        started.set()
    try:
        await serve_until_signal(running.grpc, config.ops.shutdown_grace_s, running.drain)
    finally:
        await running.stop()
