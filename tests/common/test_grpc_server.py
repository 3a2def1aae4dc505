"""The shared gRPC bootstrap: readiness only after warm-up, reflection for grpcurl, clean stop."""
from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common import grpc_server
from services.common.pb.dsv4serve.v1 import scheduler_pb2, scheduler_pb2_grpc

SCHEDULER = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
REPO_ROOT = Path(__file__).resolve().parents[2]


async def start_scheduler_shell() -> grpc_server.RunningServer:
    """A server with the Scheduler service registered (every RPC unimplemented)."""
    return await grpc_server.start_server(
        "127.0.0.1", 0, [SCHEDULER],
        lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler_pb2_grpc.SchedulerServicer(), s))


async def probe(port: int, service: str = "") -> bool:
    return await asyncio.to_thread(grpc_server.probe_health, f"127.0.0.1:{port}", service, 2.0)


async def list_services(port: int) -> list[str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.enable_http_proxy", 0)]) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for response in stub.ServerReflectionInfo(iter([request])):
            return sorted(s.name for s in response.list_services_response.service)
    return []


def test_health_reports_serving_only_after_warm_up() -> None:
    async def scenario() -> list[bool]:
        running = await start_scheduler_shell()
        try:
            seen = [await probe(running.port), await probe(running.port, SCHEDULER)]
            await running.mark_serving()
            seen += [await probe(running.port), await probe(running.port, SCHEDULER)]
        finally:
            await running.stop(grace_s=0)
        return seen

    assert asyncio.run(scenario()) == [False, False, True, True]


def test_stopped_server_is_not_ready() -> None:
    async def scenario() -> bool:
        running = await start_scheduler_shell()
        await running.mark_serving()
        await running.stop(grace_s=0)
        return await probe(running.port)

    assert asyncio.run(scenario()) is False


def test_reflection_lists_project_health_and_reflection_services() -> None:
    async def scenario() -> list[str]:
        running = await start_scheduler_shell()
        try:
            return await list_services(running.port)
        finally:
            await running.stop(grace_s=0)

    assert asyncio.run(scenario()) == sorted(
        [SCHEDULER, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"])


def test_port_already_in_use_is_an_error() -> None:
    async def scenario() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            await start_scheduler_shell_on(taken.getsockname()[1])

    async def start_scheduler_shell_on(port: int) -> None:
        running = await grpc_server.start_server("127.0.0.1", port, [], lambda s: None)
        await running.stop(0)

    with pytest.raises(RuntimeError, match="cannot listen"):
        asyncio.run(scenario())


SERVE_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from services.common import grpc_server
    from services.common.pb.dsv4serve.v1 import scheduler_pb2_grpc as stubs

    def register(server):
        stubs.add_SchedulerServicer_to_server(stubs.SchedulerServicer(), server)

    async def main():
        running = await grpc_server.start_server("127.0.0.1", 0, ["dsv4serve.v1.Scheduler"], register)
        await running.mark_serving()
        print(running.port, flush=True)
        await grpc_server.serve_until_signal(running, grace_s=1.0)
        print("stopped", flush=True)

    asyncio.run(main())
""")


def test_sigterm_stops_the_server_gracefully() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SERVE_SCRIPT], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        assert grpc_server.probe_health(f"127.0.0.1:{port}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert proc.stdout.read().strip() == "stopped"
        assert not grpc_server.probe_health(f"127.0.0.1:{port}", timeout_s=0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(shutil.which("grpcurl") is None and not (Path(sys.executable).parent / "grpcurl").exists(),
                    reason="grpcurl is not installed")
def test_grpcurl_lists_services_without_proto_files() -> None:
    grpcurl = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    proc = subprocess.Popen([sys.executable, "-c", SERVE_SCRIPT], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        listed = subprocess.run([grpcurl, "-plaintext", f"127.0.0.1:{port}", "list"],
                                capture_output=True, text=True, timeout=30)
        described = subprocess.run([grpcurl, "-plaintext", f"127.0.0.1:{port}", "describe", SCHEDULER],
                                   capture_output=True, text=True, timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert SCHEDULER in listed.stdout.split(), listed.stderr
    assert "rpc GetSchedulerState" in described.stdout, described.stderr
