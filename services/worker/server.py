"""The worker's gRPC server: `Worker` (Describe, Step, JoinWorld), health, reflection.

The servicer only converts protos ↔ the step dataclasses and hands work to the `RankGroup`; model
compute runs in the rank processes, never on this event loop. A worker that drives the whole world
reports SERVING once every rank has loaded the model, joined and warmed up, and NOT_SERVING for good
if a rank exits. A worker that drives part of a larger world reports SERVING once its ranks have
loaded: it can (re)join the world whenever the scheduler calls JoinWorld, which also replaces its
ranks after one of them exited.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import AsyncIterator, Optional

import grpc

from services.common.build_info import ABI_VERSION
from services.common.grpc_server import RunningServer, serve_until_signal, start_server
from services.common.config import WorkerConfig
from services.common.pb.dsv4serve.v1 import worker_pb2, worker_pb2_grpc
from services.common.step_protos import plan_from_proto, result_to_proto
from services.worker.describe import describe_response
from services.worker.sequence_log import SequenceLog
from services.worker.step_stream import StepInbox
from services.worker.rank_plan import (ModelRuntimeFactory, RuntimeFactory, rank_specs,
                                       store_address)
from services.worker.ranks import RankGroup, RankGroupError

_LOG = logging.getLogger(__name__)
SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Serves one Step stream at a time: a newer stream supersedes the older one, whose later
    requests are answered with an error, because both would drive the same sequence state.

    Each step is handed to the ranks as it arrives, while the step before it may still run (async
    scheduling sends N+1 before N is answered), and answered in order. `_step_lock` orders the
    hand-overs against the changes that need no step in flight: a world change (JoinWorld), a new
    stream's reset, a graceful stop.
    """

    def __init__(self, describe: worker_pb2.DescribeResponse, ranks: RankGroup,
                 ranks_started: asyncio.Task) -> None:
        self._describe = describe
        self._ranks = ranks
        self._ranks_started = ranks_started
        self._step_lock = asyncio.Lock()
        self._stream_generation = 0
        self.joined = asyncio.Event()  # set by each JoinWorld; the supervisor watches new ranks
        self._stopping = False
        self._sequences = SequenceLog()
        self._answering: set[asyncio.Task] = set()

    async def Describe(self, request: worker_pb2.DescribeRequest,
                       context: grpc.aio.ServicerContext) -> worker_pb2.DescribeResponse:
        if request.scheduler_abi_version != ABI_VERSION:
            _LOG.warning("scheduler %s speaks ABI %d, this worker ABI %d", request.scheduler_build,
                         request.scheduler_abi_version, ABI_VERSION)
        response = worker_pb2.DescribeResponse()
        response.CopyFrom(self._describe)
        response.world_round = self._ranks.world_round
        return response

    async def JoinWorld(self, request: worker_pb2.JoinWorldRequest,
                        context: grpc.aio.ServicerContext) -> worker_pb2.JoinWorldResponse:
        if self._ranks.forms_world_alone:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "this worker drives the whole world and forms it alone")
        if self._ranks.busy:
            # A step of the old world is still running (its Step stream may be gone already): it
            # may wait forever in a collective with a lost peer, and its world is being replaced
            # anyway. Its ranks go; the join below starts new ones.
            _LOG.warning("JoinWorld %d during a step of the old world: replacing this worker's "
                         "ranks", request.round)
            await self._ranks.kill()
        async with self._step_lock:  # no step may run while the world changes
            self._stream_generation += 1  # the Step streams of the old world are over
            try:
                await self._ranks.settled()  # answered, or failed with the killed ranks
                await asyncio.shield(self._ranks_started)
                await self._ranks.join(request.round)
            except RankGroupError as error:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"joining world round "
                                                                 f"{request.round}: {error}")
        _LOG.info("joined world round %d", request.round)
        self.joined.set()
        return worker_pb2.JoinWorldResponse(round=request.round)

    async def Step(self, request_iterator: AsyncIterator[worker_pb2.StepRequest],
                   context: grpc.aio.ServicerContext) -> AsyncIterator[worker_pb2.StepResponse]:
        async with self._step_lock:
            self._stream_generation += 1
            generation = self._stream_generation
            await self._drop_all_sequences()
            self._sequences.clear()
        inbox = StepInbox(request_iterator)
        answers: asyncio.Queue[Optional[asyncio.Future]] = asyncio.Queue()
        handing = asyncio.create_task(self._hand_over_all(inbox, generation, answers),
                                      name="worker step hand-over")
        try:
            while (answer := await answers.get()) is not None:
                response = await answer
                if response is None:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "the worker is shutting down")
                yield response
            await handing  # the stream ended; raises what stopped the hand-over otherwise
        finally:
            handing.cancel()
            await asyncio.gather(handing, return_exceptions=True)
            await inbox.close()

    async def drain(self, grace_s: float) -> None:
        """Graceful stop: the steps in flight finish (up to `grace_s`); later steps end the
        stream with UNAVAILABLE, so the scheduler fails its requests clearly and reconnects."""
        try:
            async with asyncio.timeout(grace_s):
                async with self._step_lock:
                    self._stopping = True
                    await self._ranks.settled()
        except TimeoutError:
            _LOG.warning("the steps in flight did not finish within the %gs shutdown grace",
                         grace_s)
        self._stopping = True

    async def _drop_all_sequences(self) -> None:
        try:
            await asyncio.shield(self._ranks_started)
            await self._ranks.reset()
        except RankGroupError:
            pass  # every step of this stream reports the failure

    async def _hand_over_all(self, inbox: StepInbox, generation: int,
                             answers: asyncio.Queue[Optional[asyncio.Future]]) -> None:
        """Hands each step of the stream to the ranks as it arrives; queues its answer's task."""
        try:
            async for request in inbox.steps():
                answers.put_nowait(await self._hand_over(request, generation, inbox))
        finally:
            answers.put_nowait(None)

    async def _hand_over(self, request: worker_pb2.StepRequest, generation: int,
                         inbox: StepInbox) -> asyncio.Future:
        """The task of the step's response; it resolves to None once a graceful stop began (no
        new step starts). The task runs on even if the stream ends: it releases the step's masks
        and logs its sequences' failures."""
        async with self._step_lock:
            if self._stopping:
                return _answered(None)
            if generation != self._stream_generation:
                return _answered(worker_pb2.StepResponse(
                    step_id=request.step_id, error="superseded by a newer Step stream"))
            self._sequences.started(request.new_sequences)
            plan = plan_from_proto(request)
            masks = inbox.masks_of(plan.step_id) if plan.masks_follow else None
            try:
                await asyncio.shield(self._ranks_started)
                answered = self._ranks.hand_over(plan, masks)
            except RankGroupError as error:
                answered = asyncio.get_running_loop().create_future()
                answered.set_exception(error)
        task = asyncio.create_task(self._answer(request, answered, inbox),
                                   name=f"worker step {request.step_id}")
        self._answering.add(task)  # held until done, even once the stream is gone
        task.add_done_callback(self._answering.discard)
        return task

    async def _answer(self, request: worker_pb2.StepRequest, answered: asyncio.Future,
                      inbox: StepInbox) -> worker_pb2.StepResponse:
        try:
            result = await answered
        except RankGroupError as error:
            self._sequences.step_failed(request, str(error))
            return worker_pb2.StepResponse(step_id=request.step_id,
                                           error=f"worker ranks failed: {error}")
        finally:
            inbox.forget(request.step_id)
        self._sequences.ended(request, result)
        return result_to_proto(result)


def _answered(response: Optional[worker_pb2.StepResponse]) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(response)
    return future


@dataclass
class RunningWorker:
    grpc: RunningServer
    ranks: RankGroup
    ranks_started: asyncio.Task
    supervision: asyncio.Task
    servicer: WorkerServicer

    @property
    def port(self) -> int:
        return self.grpc.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def wait_ready(self) -> None:
        """Returns once the ranks serve; raises `RankGroupError` if they failed to start."""
        await asyncio.shield(self.ranks_started)

    async def stop(self, grace_s: float = 2.0) -> None:
        self.supervision.cancel()
        await self.grpc.stop(grace_s)
        await self.ranks.stop()
        await asyncio.gather(self.ranks_started, self.supervision, return_exceptions=True)


async def start_worker_server(config: WorkerConfig,
                              runtime_factory: Optional[RuntimeFactory] = None) -> RunningWorker:
    """Binds the server (port 0 picks a free one) and starts the ranks in the background."""
    factory = runtime_factory or ModelRuntimeFactory()
    facts = await asyncio.to_thread(factory.describe, config)
    ranks = RankGroup(rank_specs(config, facts), factory, store_address(config),
                      forms_world_alone=config.drives_whole_world)
    ranks_started = asyncio.create_task(ranks.start(), name="worker-ranks-start")
    servicer = WorkerServicer(describe_response(config, facts), ranks, ranks_started)
    try:
        running = await start_server(
            config.host, config.port, [SERVICE_NAME],
            lambda server: worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server),
            tls=config.ops.tls, reflection_on=config.ops.grpc_reflection)
    except BaseException:
        await ranks.stop()
        raise
    supervision = asyncio.create_task(_supervise(ranks, ranks_started, running, servicer.joined),
                                      name="worker-ranks-supervision")
    return RunningWorker(running, ranks, ranks_started, supervision, servicer)


async def _supervise(ranks: RankGroup, ranks_started: asyncio.Task, running: RunningServer,
                     joined: asyncio.Event) -> None:
    """SERVING once the ranks are up. When a rank exits: NOT_SERVING for good if this worker forms
    the world alone; otherwise its world round is over, and the next JoinWorld replaces the ranks
    (then they are watched again). Ranks that cannot start stop the server, so `serve` returns and
    the process exits instead of idling NOT_SERVING."""
    try:
        await asyncio.shield(ranks_started)
    except RankGroupError as error:
        _LOG.error("worker ranks failed to start: %s", error)
        await running.server.stop(0)
        return
    await running.mark_serving()
    while True:
        joined.clear()
        reason = await ranks.wait_for_exit()
        _LOG.error("worker rank exited: %s", reason)
        if ranks.forms_world_alone:
            await running.mark_not_serving()
            return
        await joined.wait()


async def serve(config: WorkerConfig, *, started: Optional[asyncio.Event] = None) -> None:
    """Runs the worker until SIGINT/SIGTERM; `started` is set once it listens.

    Raises `RankGroupError` when the ranks cannot start (bad checkpoint, device missing), so the
    process exits non-zero instead of staying NOT_SERVING forever.
    """
    running = await start_worker_server(config)
    _LOG.info("worker listening on %s:%d", config.host, running.port)
    if started is not None:
        started.set()
    try:
        await serve_until_signal(running.grpc, config.ops.shutdown_grace_s, running.servicer.drain)
        # Ranks that failed to start stopped the server; a signal during start-up is no failure.
        start_error = running.ranks_started.exception() if running.ranks_started.done() else None
    finally:
        await running.stop()
    if start_error is not None:
        raise start_error
