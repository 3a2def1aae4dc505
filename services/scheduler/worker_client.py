"""Connections to the workers: handshake, the Step streams, failure detection and reconnection.

`WorkerSet` owns the connection state of every worker. It is ready when every worker has passed the
handshake and has a Step stream; then the step loop is told `on_ready(description)`. A step that
fails or times out, or a periodic probe (`Describe`) that fails, closes every stream, marks the set
not ready and tells `on_lost(reason)`; a supervisor task keeps re-handshaking until every worker is
back, then opens new streams (which start with no sequences) and reports ready again.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.build_info import ABI_VERSION, build_id
from services.common.config import TlsConfig
from services.common.grpc_channels import aio_channel
from services.common.pb.dsv4serve.v1 import worker_pb2, worker_pb2_grpc
from services.scheduler.errors import WorkerLost
from services.common.step_descriptors import StepPlan, StepResult, merge_results
from services.common.step_protos import plan_to_proto, result_from_proto
from services.scheduler.worker_description import WorkerDescription
from services.scheduler.worker_protos import description_from_proto

log = logging.getLogger(__name__)

_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


PROBE_TIMEOUTS_TO_LOSE = 3


class WorkerUnreachable(Exception):
    """Describe or the health check failed, or the worker is not SERVING yet. `timed_out`: the
    worker did not answer in time (maybe only busy), as opposed to refusing or being gone."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class HandshakeRefused(Exception):
    """The worker answered Describe but disagrees with the scheduler (ABI, model, block size)."""


@dataclass(frozen=True)
class WorkerTimeouts:
    step_s: float = 300.0     # a step slower than this means the worker hangs
    probe_s: float = 5.0      # Describe round trip (handshake, probe, CheckReady)


@dataclass(frozen=True)
class WorkerStatusView:
    address: str
    connected: bool
    error: str
    last_ok_age_ms: int


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    workers: list[WorkerStatusView]


class WorkerConnection:
    """One worker: its channel, handshake facts and (while ready) its Step stream."""

    def __init__(self, address: str, tls: TlsConfig = TlsConfig()) -> None:
        self.address = address
        self.description: Optional[WorkerDescription] = None
        self.error = "not connected yet"
        self.last_ok: Optional[float] = None
        self._channel = aio_channel(address, tls, _CHANNEL_OPTIONS)
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._stream: Optional[grpc.aio.StreamStreamCall] = None
        self.probe_timeouts = 0  # consecutive probes that timed out (see WorkerSet._probe)

    async def describe(self, timeout_s: float) -> WorkerDescription:
        """Describe, then a grpc.health.v1 check: a worker counts only once it reports SERVING
        (its ranks loaded the model). Raises WorkerUnreachable naming the worker."""
        request = worker_pb2.DescribeRequest(scheduler_abi_version=ABI_VERSION,
                                             scheduler_build=build_id())
        try:
            response = await self._stub.Describe(request, timeout=timeout_s)
            health = await self._health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise WorkerUnreachable(
                f"worker {self.address}: {error.code().name}: {error.details()}",
                timed_out=error.code() == grpc.StatusCode.DEADLINE_EXCEEDED) from None
        if health.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(health.status)
            raise WorkerUnreachable(f"worker {self.address} is not serving yet (health {status})")
        self.last_ok = time.monotonic()
        return description_from_proto(response)

    def open_stream(self) -> None:
        self.close_stream()
        self._stream = self._stub.Step()

    def close_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    async def step(self, request: worker_pb2.StepRequest, timeout_s: float) -> StepResult:
        """One round trip on the stream; raises WorkerLost naming this worker."""
        stream = self._stream  # `close_stream` may run meanwhile; this call keeps its stream
        if stream is None:
            raise WorkerLost(f"worker {self.address}: no open Step stream")
        try:
            response = await asyncio.wait_for(self._round_trip(stream, request), timeout_s)
        except asyncio.TimeoutError:
            raise WorkerLost(f"worker {self.address} did not answer step {request.step_id} "
                             f"within {timeout_s:g}s") from None
        except grpc.aio.AioRpcError as error:
            message = f"worker {self.address}: {error.code().name}: {error.details()}"
            raise WorkerLost(message) from None
        except asyncio.InvalidStateError:  # writing to a stream the worker already ended
            raise WorkerLost(f"worker {self.address} ended its Step stream: "
                             f"{(await stream.code()).name}: {await stream.details()}") from None
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise  # this task is being cancelled
            # The stream was cancelled under us (`close_stream` after another worker failed).
            raise WorkerLost(f"worker {self.address}: Step stream closed during step "
                             f"{request.step_id}") from None
        self.last_ok = time.monotonic()
        return result_from_proto(response)

    async def _round_trip(self, stream: grpc.aio.StreamStreamCall,
                          request: worker_pb2.StepRequest) -> worker_pb2.StepResponse:
        await stream.write(request)
        response = await stream.read()
        if response is grpc.aio.EOF:
            raise WorkerLost(f"worker {self.address} closed its Step stream")
        if response.step_id != request.step_id:
            raise WorkerLost(f"worker {self.address} answered step {response.step_id} to step "
                             f"{request.step_id}")
        return response

    def status(self, now: float) -> WorkerStatusView:
        age = int((now - self.last_ok) * 1000) if self.last_ok is not None else 0
        return WorkerStatusView(self.address, self.description is not None and not self.error,
                                self.error, age)

    async def close(self) -> None:
        self.close_stream()
        await self._channel.close()


class WorkerSet:
    """Every worker of the deployment, handled as one unit: every step goes to all (each gets the
    rows of the partitions it holds; workers holding the same partition get the same rows),
    readiness needs all."""

    def __init__(self, addresses: tuple[str, ...], *, block_size: int,
                 expected_fingerprint: Optional[str], probe_interval_s: float,
                 timeouts: WorkerTimeouts, on_ready: Callable[[WorkerDescription], None],
                 on_lost: Callable[[str], None], tls: TlsConfig = TlsConfig()) -> None:
        self._connections = [WorkerConnection(address, tls) for address in addresses]
        self._block_size = block_size
        self._reference_fingerprint = expected_fingerprint
        self._fingerprint_source = "the expected fingerprint" if expected_fingerprint else ""
        self._probe_interval_s = probe_interval_s
        self._timeouts = timeouts
        self._on_ready = on_ready
        self._on_lost = on_lost
        self._wake = asyncio.Event()
        self._supervisor: Optional[asyncio.Task] = None
        self.ready = False
        self._lost_reason = ""
        self.description: Optional[WorkerDescription] = None

    def start(self) -> None:
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(),
                                                                  name="worker supervisor")

    async def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
        for connection in self._connections:
            await connection.close()

    # ---- supervision ------------------------------------------------------------------------
    async def _supervise(self) -> None:
        while True:
            if self.ready:
                await self._probe()
            else:
                await self._connect_all()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._probe_interval_s)
            except asyncio.TimeoutError:
                pass

    async def _connect_all(self) -> None:
        handshakes = await asyncio.gather(*(self._handshake(c) for c in self._connections))
        if not all(handshakes):
            return
        first = self._connections[0].description
        if not self._same_block_groups(first):
            return
        partitions = sorted({p for c in self._connections for p in c.description.partition_ids})
        budget = min(c.description.max_num_batched_tokens for c in self._connections)
        self.description = replace(first, partition_ids=tuple(partitions),
                                   max_num_batched_tokens=budget)
        for connection in self._connections:
            connection.open_stream()
        self.ready = True
        log.info("all %d workers connected; partitions %s", len(self._connections), partitions)
        self._on_ready(self.description)

    def _same_block_groups(self, first: WorkerDescription) -> bool:
        """Every partition gets the first worker's block capacity, so all must report the same."""
        for connection in self._connections[1:]:
            if connection.description.block_groups != first.block_groups:
                connection.error = (
                    f"worker {connection.address} refused: its block groups "
                    f"{connection.description.block_groups} differ from worker "
                    f"{self._connections[0].address}'s {first.block_groups}")
                connection.description = None
                return False
        return True

    async def _handshake(self, connection: WorkerConnection) -> bool:
        try:
            description = await connection.describe(self._timeouts.probe_s)
            self._validate(connection.address, description)
        except WorkerUnreachable as error:
            connection.description = None
            connection.error = str(error)
            return False
        except HandshakeRefused as refused:
            if connection.error != str(refused):
                log.error("%s", refused)
            connection.description = None
            connection.error = str(refused)
            return False
        connection.description = description
        connection.error = ""
        return True

    def _validate(self, address: str, description: WorkerDescription) -> None:
        if description.abi_version != ABI_VERSION:
            raise HandshakeRefused(
                f"worker {address} refused: its ABI version is {description.abi_version} (build "
                f"{description.build_id}) but this scheduler's ABI version is {ABI_VERSION} (build "
                f"{build_id()}); scheduler and workers must come from the same release")
        if self._reference_fingerprint is None:
            self._reference_fingerprint = description.model_fingerprint
            self._fingerprint_source = f"the first worker's ({address})"
        elif description.model_fingerprint != self._reference_fingerprint:
            raise HandshakeRefused(
                f"worker {address} refused: its model fingerprint {description.model_fingerprint} "
                f"differs from {self._fingerprint_source} {self._reference_fingerprint}")
        if description.block_size != self._block_size:
            raise HandshakeRefused(
                f"worker {address} refused: its block size is {description.block_size} but the "
                f"scheduler's --block-size is {self._block_size}")

    async def _probe(self) -> None:
        """A worker that refuses or is gone is lost at once; one that is only slow to answer is
        lost after PROBE_TIMEOUTS_TO_LOSE probes in a row (a loaded host is not a dead one)."""
        outcomes = await self._describe_all()
        for connection, outcome in zip(self._connections, outcomes):
            if not isinstance(outcome, WorkerUnreachable):
                connection.probe_timeouts = 0
                continue
            connection.probe_timeouts = connection.probe_timeouts + 1 if outcome.timed_out else 0
            if not outcome.timed_out or connection.probe_timeouts >= PROBE_TIMEOUTS_TO_LOSE:
                self._lose(connection, f"probe failed: {outcome}")
                return

    async def _describe_all(self) -> list:
        """Each worker's description or its WorkerUnreachable."""
        probes = (c.describe(self._timeouts.probe_s) for c in self._connections)
        return await asyncio.gather(*probes, return_exceptions=True)

    def _lose(self, connection: WorkerConnection, reason: str) -> None:
        connection.error = reason
        if not self.ready:
            return
        log.error("%s; failing in-flight requests and reconnecting", reason)
        self.ready = False
        self._lost_reason = reason
        for each in self._connections:
            each.close_stream()
        self._on_lost(reason)
        self._wake.set()

    # ---- steps and readiness ----------------------------------------------------------------
    async def step(self, plan: StepPlan) -> StepResult:
        """Send the plan to every worker and merge the answers; raises WorkerLost."""
        if not self.ready:
            raise WorkerLost(self._lost_reason or "workers are not connected")
        if len(self._connections) == 1:
            requests = [plan_to_proto(plan)]
        else:  # each worker gets the rows of the partitions it holds
            requests = [plan_to_proto(plan.restricted_to(frozenset(c.description.partition_ids)))
                        for c in self._connections]
        outcomes = await asyncio.gather(
            *(c.step(r, self._timeouts.step_s) for c, r in zip(self._connections, requests)),
            return_exceptions=True)
        for connection, outcome in zip(self._connections, outcomes):
            if isinstance(outcome, WorkerLost):
                if not self.ready:  # lost meanwhile (a probe): that is the reason to report
                    raise WorkerLost(self._lost_reason)
                self._lose(connection, str(outcome))
                raise outcome
            if isinstance(outcome, BaseException):
                raise outcome
        return merge_results(outcomes)

    async def check_ready(self) -> Readiness:
        """A fresh Describe round trip to every worker (short timeout)."""
        outcomes = await self._describe_all()
        failures = [str(o) for o in outcomes if isinstance(o, WorkerUnreachable)]
        if failures:
            reason = "; ".join(failures)
        elif not self.ready:
            reason = "; ".join(f"worker {c.address}: {c.error}" for c in self._connections
                               if c.error) or "workers are reconnecting"
        else:
            reason = ""
        return Readiness(not reason, reason, self.statuses())

    def statuses(self) -> list[WorkerStatusView]:
        now = time.monotonic()
        return [c.status(now) for c in self._connections]
