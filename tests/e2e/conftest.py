"""The real stack, started once per session through the project's own launcher.

`stack` runs `python -m services.cli stack --model <tiny model> …` (and `demo_stack` the same on the
trained demo model, the default one) with every port 0 (the launcher
picks free ports and reports them in its ready file), waits for the stack to be ready under a
deadline, and stops it at the end with SIGTERM. When startup fails, or any test failed, the children's
logs are printed so the cause is visible without rerunning.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVED_MODEL_NAME = "dsv4-tiny-e2e"
DEMO_SERVED_MODEL_NAME = "dsv4-demo-e2e"
STARTUP_TIMEOUT_S = float(os.environ.get("DSV4SERVE_E2E_STARTUP_TIMEOUT", "240"))
STOP_TIMEOUT_S = 60.0
LOG_TAIL_CHARS = 6000


@dataclass(frozen=True)
class RunningStack:
    base_url: str
    scheduler_address: str
    worker_address: str
    served_model_name: str
    model_dir: Path
    log_dir: Path
    process: subprocess.Popen
    ready_file: Path

    def pids(self) -> dict[str, int]:
        """The children's pids as the launcher's ready file lists them now (rewritten on restarts)."""
        return json.loads(self.ready_file.read_text())["pids"]

    def logs(self) -> str:
        """The tail of the launcher's and every child's log, for failure messages."""
        parts = []
        for log in sorted(self.log_dir.glob("*.log")):
            text = log.read_text(errors="replace")
            parts.append(f"----- {log.name} (last {LOG_TAIL_CHARS} chars) -----\n{text[-LOG_TAIL_CHARS:]}")
        return "\n".join(parts) or "(no logs were written)"


def _start(model_dir: Path, run_dir: Path, served_name: str,
           extra_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, Path]:
    log_dir = run_dir / "logs"
    log_dir.mkdir(parents=True)
    ready_file = run_dir / "ready.json"
    command = [sys.executable, "-m", "services.cli", "stack", "--model", str(model_dir),
               "--served-model-name", served_name, "--port", "0", "--scheduler-port", "0",
               "--worker-port", "0", "--max-model-len", "2048", "--max-num-batched-tokens", "2048",
               "--kv-cache-memory", "256MiB", "--startup-timeout", str(STARTUP_TIMEOUT_S),
               "--log-dir", str(log_dir), "--ready-file", str(ready_file), *extra_args]
    with (log_dir / "launcher.log").open("wb") as launcher_log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=launcher_log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return process, ready_file


def _wait_ready(process: subprocess.Popen, ready_file: Path) -> dict[str, str] | str:
    """The ready file's contents, or why the stack did not become ready."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S + 30  # the launcher enforces its own deadline first
    while time.monotonic() < deadline:
        if ready_file.exists():
            return json.loads(ready_file.read_text())
        if process.poll() is not None:
            return f"the launcher exited with status {process.returncode} before the stack was ready"
        time.sleep(0.25)
    return f"the stack was not ready within {STARTUP_TIMEOUT_S + 30:.0f}s"


def _stop(process: subprocess.Popen) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@pytest.fixture(scope="session")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    """The stack on the tiny random checkpoint (tiny-a): tests of the machinery, not of answers."""
    yield from launch_stack(tiny_model_dir, tmp_path_factory.mktemp("stack"), request)


def launch_stack(model_dir: Path, run_dir: Path, request: pytest.FixtureRequest,
                 extra_args: tuple[str, ...] = (),
                 served_name: str = SERVED_MODEL_NAME) -> Iterator[RunningStack]:
    """Body of a stack fixture: `dsv4serve stack` on free ports with `extra_args`, stopped at the
    end; its logs are printed when a test failed or the launcher did not exit 0."""
    process, ready_file = _start(model_dir, run_dir, served_name, extra_args)
    ready = _wait_ready(process, ready_file)
    handle_logs = RunningStack("", "", "", served_name, model_dir, run_dir / "logs", process,
                               ready_file)
    if isinstance(ready, str):
        _stop(process)
        pytest.fail(f"dsv4serve stack did not start: {ready}\n{handle_logs.logs()}", pytrace=False)
    running = RunningStack(ready["base_url"], ready["scheduler_address"], ready["worker_address"],
                           served_name, model_dir, run_dir / "logs", process, ready_file)
    failed_before = request.session.testsfailed
    yield running
    status = _stop(process)
    if request.session.testsfailed > failed_before or status != 0:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        header = f"dsv4serve stack logs (launcher exit status {status})"
        if reporter is not None:
            reporter.write_sep("=", header)
            reporter.write_line(running.logs())


@pytest.fixture(scope="session")
def demo_stack(tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    """The stack on the default model, the trained demo (expanded like `make run` does)."""
    from services.demo.export import default_demo_model_dir

    yield from launch_stack(default_demo_model_dir(), tmp_path_factory.mktemp("demo-stack"), request,
                            served_name=DEMO_SERVED_MODEL_NAME)


@pytest.fixture()
def http(stack: RunningStack) -> Iterator[httpx.Client]:
    """An HTTP client for the stack's frontend (no proxies; generous timeout for CPU decoding)."""
    with httpx.Client(base_url=stack.base_url, timeout=120.0, trust_env=False) as client:
        yield client
