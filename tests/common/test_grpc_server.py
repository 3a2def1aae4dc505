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


def grpcurl_path() -> str:
    return shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")


async def start_tls_shell(tls, reflection_on: bool = True) -> grpc_server.RunningServer:
    running = await grpc_server.start_server(
        "127.0.0.1", 0, [SCHEDULER],
        lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler_pb2_grpc.SchedulerServicer(), s),
        tls=tls, reflection_on=reflection_on)
    await running.mark_serving()
    return running


async def grpcurl(*args: str) -> subprocess.CompletedProcess:
    proc = await asyncio.create_subprocess_exec(grpcurl_path(), *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), err.decode())


def test_mutual_tls_admits_only_clients_with_a_certificate_from_the_ca(dev_certs) -> None:
    from services.common.config import TlsConfig

    async def scenario() -> dict[str, bool]:
        running = await start_tls_shell(dev_certs.tls("stack"))
        address = f"127.0.0.1:{running.port}"
        clients = {"client certificate": dev_certs.tls("client"),
                   "no certificate": TlsConfig(ca_file=dev_certs.ca),
                   "certificate of another CA": TlsConfig(cert_file=dev_certs.cert("rogue/rogue"),
                                                          key_file=dev_certs.key("rogue/rogue"),
                                                          ca_file=dev_certs.ca),
                   "plaintext": TlsConfig()}
        try:
            return {name: await asyncio.to_thread(grpc_server.probe_health, address, "", 5.0, tls)
                    for name, tls in clients.items()}
        finally:
            await running.stop(grace_s=0)

    assert asyncio.run(scenario()) == {"client certificate": True, "no certificate": False,
                                       "certificate of another CA": False, "plaintext": False}


def test_grpcurl_works_with_the_certificates_and_lists_only_with_reflection_on(dev_certs) -> None:
    certs = ["-cacert", str(dev_certs.ca), "-cert", str(dev_certs.cert("client")),
             "-key", str(dev_certs.key("client"))]
    protos = ["-import-path", str(REPO_ROOT / "protos"), "-proto", "dsv4serve/v1/scheduler.proto"]

    async def scenario(reflection_on: bool) -> tuple[subprocess.CompletedProcess, ...]:
        running = await start_tls_shell(dev_certs.tls("stack"), reflection_on)
        address = f"127.0.0.1:{running.port}"
        try:
            return (await grpcurl(*certs, address, "list"),
                    await asyncio.to_thread(grpc_server.probe_health, address, "", 5.0,
                                            dev_certs.tls("client")),
                    await grpcurl(*certs, *protos, address, f"{SCHEDULER}/GetModelInfo"),
                    await grpcurl("-cacert", str(dev_certs.ca), address, "list"))
        finally:
            await running.stop(grace_s=0)

    listed, serving, call, no_cert = asyncio.run(scenario(reflection_on=True))
    assert SCHEDULER in listed.stdout.split(), listed.stderr
    assert no_cert.returncode != 0 and SCHEDULER not in no_cert.stdout

    listed, serving, call, _ = asyncio.run(scenario(reflection_on=False))
    assert listed.returncode != 0 and "reflection" in listed.stderr
    assert serving
    # The servicer shell implements nothing: reaching it with the protos is what counts.
    assert "Unimplemented" in call.stderr, call.stderr
