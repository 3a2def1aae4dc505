"""For tests: a worker server on its own event loop thread, and a blocking Step stream client."""
from __future__ import annotations

import asyncio
import queue
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config import WorkerConfig
from services.common.pb.dsv4serve.v1 import worker_pb2, worker_pb2_grpc
from services.worker.rank_plan import RuntimeFactory
from services.worker.server import RunningWorker, start_worker_server

START_TIMEOUT_S = 120.0


class WorkerThread:
    """A started worker; `running` lives on `loop`, which runs in a background thread."""

    def __init__(self, config: WorkerConfig, factory: Optional[RuntimeFactory]) -> None:
        self._config, self._factory = config, factory
        self._started = threading.Event()
        self._error: Optional[BaseException] = None
        self.running: Optional[RunningWorker] = None
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop: Optional[asyncio.Event] = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> "WorkerThread":
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise TimeoutError("worker server did not bind in time")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(START_TIMEOUT_S)

    @property
    def address(self) -> str:
        assert self.running is not None
        return self.running.address

    async def _main(self) -> None:
        try:
            self.running = await start_worker_server(self._config, self._factory)
        except BaseException as error:
            self._error = error
            self._started.set()
            return
        self.loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        await self._stop.wait()
        await self.running.stop()


def local_channel(address: str) -> grpc.Channel:
    """A channel straight to `address`, never through an http_proxy from the environment."""
    return grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])


@contextmanager
def worker_in_thread(config: WorkerConfig,
                     factory: Optional[RuntimeFactory] = None) -> Iterator[WorkerThread]:
    worker = WorkerThread(config, factory).start()
    try:
        yield worker
    finally:
        worker.stop()


def wait_for_health(channel: grpc.Channel, wanted: int, timeout_s: float = START_TIMEOUT_S) -> None:
    """Follows health Watch until `wanted` is reported; raises on the deadline."""
    stub = health_pb2_grpc.HealthStub(channel)
    call = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
    try:
        for response in call:
            if response.status == wanted:
                return
    finally:
        call.cancel()


class StepStream:
    """One bidirectional Step stream driven request by request from a blocking test."""

    _CLOSE = object()

    def __init__(self, channel: grpc.Channel, timeout_s: float = 60.0) -> None:
        self._requests: "queue.Queue[object]" = queue.Queue()
        stub = worker_pb2_grpc.WorkerStub(channel)
        self._responses = stub.Step(iter(self._requests.get, self._CLOSE), timeout=timeout_s)

    def send(self, request: worker_pb2.StepRequest) -> None:
        self._requests.put(request)

    def receive(self) -> worker_pb2.StepResponse:
        return next(self._responses)

    def call(self, request: worker_pb2.StepRequest) -> worker_pb2.StepResponse:
        self.send(request)
        return self.receive()

    def cancel(self) -> None:
        """Cancel the call, as a scheduler that lost this worker does."""
        self._responses.cancel()

    def close(self) -> None:
        self._requests.put(self._CLOSE)
        for _ in self._responses:  # drain until the server ends the stream
            pass
