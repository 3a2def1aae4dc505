"""One worker as the scheduler sees it: its channel, handshake facts and (while ready) its Step
stream; every failure is an exception naming the worker."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.build_info import ABI_VERSION, build_id
from services.common.config import TlsConfig
from services.common.grpc_channels import aio_channel
from services.common.pb.dsv4serve.v1 import worker_pb2, worker_pb2_grpc
from services.common.step_descriptors import StepResult
from services.common.step_protos import result_from_proto
from services.scheduler.errors import WorkerLost
from services.scheduler.worker_description import WorkerDescription
from services.scheduler.worker_protos import description_from_proto

_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


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
    # JoinWorld: ranks may reload weights (respawned) before they join and warm up together.
    join_s: float = 600.0


@dataclass(frozen=True)
class WorkerStatusView:
    address: str
    connected: bool
    error: str
    last_ok_age_ms: int


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

    async def join_world(self, round_: int, timeout_s: float) -> None:
        """JoinWorld(round_); raises WorkerUnreachable naming the worker when it fails."""
        try:
            await self._stub.JoinWorld(worker_pb2.JoinWorldRequest(round=round_), timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise WorkerUnreachable(f"worker {self.address} did not join world round {round_}: "
                                    f"{error.code().name}: {error.details()}") from None
        self.last_ok = time.monotonic()

    def open_stream(self) -> None:
        self.close_stream()
        self._stream = self._stub.Step()

    def close_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    async def send(self, request: worker_pb2.StepRequest, timeout_s: float) -> None:
        """Writes a step (or masks message) on the stream; raises WorkerLost naming this worker."""
        stream = self._open_stream()
        step_id = request.masks.step_id if request.HasField("masks") else request.step_id
        await self._guarded(stream, stream.write(request), step_id, timeout_s, "take")

    async def receive(self, step_id: int, timeout_s: float) -> StepResult:
        """Reads the answer to step `step_id` (the oldest one unanswered); raises WorkerLost."""
        stream = self._open_stream()
        response = await self._guarded(stream, self._read(stream, step_id), step_id, timeout_s,
                                       "answer")
        self.last_ok = time.monotonic()
        return result_from_proto(response)

    def _open_stream(self) -> grpc.aio.StreamStreamCall:
        stream = self._stream  # `close_stream` may run meanwhile; a call keeps its stream
        if stream is None:
            raise WorkerLost(f"worker {self.address}: no open Step stream")
        return stream

    async def _guarded(self, stream: grpc.aio.StreamStreamCall, operation: Awaitable[Any],
                       step_id: int, timeout_s: float, verb: str) -> Any:
        """`operation` on the stream, its failures as WorkerLost naming this worker."""
        try:
            return await asyncio.wait_for(operation, timeout_s)
        except asyncio.TimeoutError:
            raise WorkerLost(f"worker {self.address} did not {verb} step {step_id} "
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
                             f"{step_id}") from None

    async def _read(self, stream: grpc.aio.StreamStreamCall,
                    step_id: int) -> worker_pb2.StepResponse:
        response = await stream.read()
        if response is grpc.aio.EOF:
            raise WorkerLost(f"worker {self.address} closed its Step stream")
        if response.step_id != step_id:
            raise WorkerLost(f"worker {self.address} answered step {response.step_id} to step "
                             f"{step_id}")
        return response

    def status(self, now: float) -> WorkerStatusView:
        age = int((now - self.last_ok) * 1000) if self.last_ok is not None else 0
        return WorkerStatusView(self.address, self.description is not None and not self.error,
                                self.error, age)

    async def close(self) -> None:
        self.close_stream()
        await self._channel.close()
