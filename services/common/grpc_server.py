"""The one grpc.aio bootstrap every gRPC service uses: TLS, health, reflection, graceful stop.

Health starts NOT_SERVING for the whole server ("") and for each named service; a service calls
`mark_serving()` only after its warm-up (model loaded, workers connected), so a readiness probe never
sees SERVING from a server that cannot do work yet. Reflection (unless turned off) lists the services
so `grpcurl list` and `describe` work with no .proto files on the client's side. With a `TlsConfig`
naming a certificate the port serves TLS, mutual TLS when it names a CA (`grpc_channels.py`).

    server = await start_server(host, port, [SERVICE_NAME], lambda s: add_XServicer_to_server(x, s))
    ... warm up ...
    await server.mark_serving()
    await serve_until_signal(server, grace_s, drain)
"""
from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from services.common.config import TlsConfig
from services.common.grpc_channels import blocking_channel, server_credentials

# Step descriptors carry whole prompts and bitmask rows: allow more than gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 64 << 20
DEFAULT_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
_OVERALL = ""


@dataclass
class RunningServer:
    """A started server and its health servicer (owned here: services only flip readiness)."""

    server: grpc.aio.Server
    port: int
    health: health_aio.HealthServicer
    service_names: tuple[str, ...]

    async def mark_serving(self) -> None:
        await self._set_all(health_pb2.HealthCheckResponse.SERVING)

    async def mark_not_serving(self) -> None:
        await self._set_all(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace_s: float) -> None:
        """Report NOT_SERVING, refuse new calls, give in-flight calls `grace_s` seconds, then cancel them."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)

    async def _set_all(self, status: int) -> None:
        for name in (_OVERALL, *self.service_names):
            await self.health.set(name, status)


async def start_server(host: str, port: int, service_names: Sequence[str],
                       register: Callable[[grpc.aio.Server], None],
                       options: Sequence[tuple[str, int]] = DEFAULT_OPTIONS, *,
                       tls: TlsConfig = TlsConfig(), reflection_on: bool = True) -> RunningServer:
    """Create, register and start a server on host:port (port 0: a free one, reported in `.port`).

    `register` adds the project's servicers; `service_names` are their full names
    (`scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name`). Raises RuntimeError when the
    address cannot be bound.
    """
    server = grpc.aio.server(options=list(options))
    register(server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = tuple(service_names)
    if reflection_on:
        reflection.enable_server_reflection(
            (*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server)
    try:
        if tls.serves_tls:
            bound_port = server.add_secure_port(f"{host}:{port}", server_credentials(tls))
        else:
            bound_port = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:  # grpc raises it when the bind fails
        raise RuntimeError(f"cannot listen on {host}:{port} (in use or not a local address): {exc}") from None
    running = RunningServer(server=server, port=bound_port, health=health, service_names=names)
    await running.mark_not_serving()
    await server.start()
    return running


Drain = Callable[[float], Awaitable[None]]


async def serve_until_signal(running: RunningServer, grace_s: float = 5.0,
                             drain: Optional[Drain] = None) -> None:
    """Run until SIGINT/SIGTERM (or the server terminates), then stop gracefully.

    On a signal, health turns NOT_SERVING first; then `drain(grace_s)` (the service's own graceful
    stop: finish or end its in-flight work, within the grace) runs while the server still answers,
    and only then the server stops (in-flight calls get what is left of the grace, at least 1 s).
    """
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop_requested.set)
    try:
        signalled = asyncio.ensure_future(stop_requested.wait())
        terminated = asyncio.ensure_future(running.server.wait_for_termination())
        await asyncio.wait({signalled, terminated}, return_when=asyncio.FIRST_COMPLETED)
        signalled.cancel()
        if drain is not None and not terminated.done():
            await running.health.enter_graceful_shutdown()  # NOT_SERVING for good
            await drain(grace_s)
            grace_s = 1.0
        # Not cancelled: cancelling wait_for_termination would cancel grpc's own shutdown future.
        await running.stop(grace_s)
        await terminated
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def probe_health(address: str, service: str = _OVERALL, timeout_s: float = 2.0,
                 tls: TlsConfig = TlsConfig()) -> bool:
    """True when `address` answers grpc.health.v1 Check with SERVING for `service` (blocking call)."""
    with blocking_channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return response.status == health_pb2.HealthCheckResponse.SERVING
