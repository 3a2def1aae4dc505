"""The stack with mutual TLS between its services, reflection off, JSON logs and a request deadline.

Certificates come from the project's dev-cert script (a CA and a `stack` identity every service
uses; a `client` identity for tools). Checks the operator-facing promises: clients without a
certificate are refused, grpcurl and `dsv4serve probe` work with the certificates, reflection is off
while calls made with the .proto files still work, one request id shows up in all three services'
JSON logs, and `--request-timeout-s` ends a request with a clear error and frees it.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import grpc
import httpx
import pytest

from services.common.config import TlsConfig
from tests.e2e.conftest import REPO_ROOT, RunningStack, launch_stack
from tests.e2e.helpers import describe_usage, is_idle, scheduler_state, wait_for

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT_S = 3.0
SCHEDULER = "dsv4serve.v1.Scheduler"


@pytest.fixture(scope="module")
def secure_stack(tiny_model_dir: Path, dev_certs, tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    flags = ("--tls-cert", str(dev_certs.cert("stack")), "--tls-key", str(dev_certs.key("stack")),
             "--tls-ca", str(dev_certs.ca), "--no-grpc-reflection", "--log-format", "json",
             "--request-timeout-s", str(REQUEST_TIMEOUT_S))
    yield from launch_stack(tiny_model_dir, tmp_path_factory.mktemp("secure-stack"), request, flags)


@pytest.fixture()
def http(secure_stack: RunningStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=secure_stack.base_url, timeout=120.0, trust_env=False) as client:
        yield client


def grpcurl(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def chat(model: str, max_tokens: int, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": max_tokens, **extra}


def test_serves_over_mutual_tls_with_one_request_id_in_every_services_json_log(secure_stack, http):
    response = http.post("/v1/chat/completions", json=chat(secure_stack.served_model_name, 4),
                         headers={"X-Request-Id": "trace-7f3a"})
    assert response.status_code == 200, response.text
    assert response.headers["X-Request-Id"] == "trace-7f3a"

    def services_logging_the_id() -> set[str]:
        found = set()
        for name in ("frontend", "scheduler", "worker"):
            for line in (secure_stack.log_dir / f"{name}.log").read_text().splitlines():
                if line.startswith("{") and json.loads(line).get("request_id") == "trace-7f3a":
                    found.add(json.loads(line)["service"])
        return found

    assert wait_for(lambda: services_logging_the_id() == {"frontend", "scheduler", "worker"}, 10), \
        services_logging_the_id()


def test_a_client_without_a_certificate_is_refused(secure_stack, dev_certs):
    state = scheduler_state(secure_stack.scheduler_address, tls=dev_certs.tls("client"))
    assert state.partitions
    for refused in (TlsConfig(ca_file=dev_certs.ca), TlsConfig()):
        with pytest.raises(grpc.RpcError) as error:
            scheduler_state(secure_stack.scheduler_address, tls=refused)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    no_cert = grpcurl("-cacert", str(dev_certs.ca), "-import-path", str(REPO_ROOT / "protos"),
                      "-proto", "dsv4serve/v1/worker.proto", secure_stack.worker_address,
                      "dsv4serve.v1.Worker/Describe")
    assert no_cert.returncode != 0 and "model_fingerprint" not in no_cert.stdout


def test_grpcurl_calls_with_protos_and_certificates_while_reflection_is_off(secure_stack, dev_certs):
    certs = ["-cacert", str(dev_certs.ca), "-cert", str(dev_certs.cert("client")),
             "-key", str(dev_certs.key("client"))]
    listed = grpcurl(*certs, secure_stack.scheduler_address, "list")
    assert listed.returncode != 0 and "reflection" in listed.stderr
    state = grpcurl(*certs, "-import-path", str(REPO_ROOT / "protos"), "-proto", "dsv4serve/v1/scheduler.proto",
                    "-d", "{}", secure_stack.scheduler_address, f"{SCHEDULER}/GetSchedulerState")
    assert state.returncode == 0, state.stderr
    assert "partitions" in json.loads(state.stdout)


def test_grpc_health_probe_works_with_the_certificates(secure_stack, dev_certs):
    def probe(*tls_flags: str) -> int:
        return subprocess.run([sys.executable, "-m", "services.cli", "probe", "grpc",
                               secure_stack.scheduler_address, *tls_flags],
                              cwd=REPO_ROOT, capture_output=True, timeout=60).returncode

    assert probe("--tls-ca", str(dev_certs.ca), "--tls-cert", str(dev_certs.cert("client")),
                 "--tls-key", str(dev_certs.key("client"))) == 0
    assert probe() == 1


def test_request_timeout_ends_streams_with_an_error_event_and_bodies_with_504(secure_stack, http,
                                                                              dev_certs):
    # ignore_eos and ~2000 tokens: far longer than the deadline even on a fast machine.
    body = chat(secure_stack.served_model_name, 2000, ignore_eos=True)
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        assert stream.status_code == 200
        events = [line[len("data: "):] for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "request timeout of 3s" in error["message"] and error["code"] == "DEADLINE_EXCEEDED"

    blocking = http.post("/v1/chat/completions", json=body)
    assert blocking.status_code == 504
    assert blocking.json()["error"]["type"] == "timeout"

    def state():
        return scheduler_state(secure_stack.scheduler_address, tls=dev_certs.tls("client"))

    assert wait_for(lambda: is_idle(state()), 20), describe_usage(state())
    assert f'dsv4serve:request_timeouts_total{{model_name="{secure_stack.served_model_name}"}} 2.0' \
        in http.get("/metrics").text
