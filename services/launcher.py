"""`dsv4serve stack`: worker, scheduler and frontend as three local child processes.

Start order is worker → scheduler → frontend, each waited on by its own readiness check (gRPC health
SERVING, then HTTP /health 200) under one startup deadline. Afterwards the launcher only supervises:
Ctrl-C / SIGTERM stops the stack cleanly (exit 0); a child that exits on its own stops the rest
(exit 1). Stopping goes in reverse order: SIGTERM, a grace period, then SIGKILL to the child's whole
process group, so rank processes a worker spawned never outlive it. A child started by the launcher
also gets SIGTERM if the launcher itself dies (`follow_launcher`, Linux parent-death signal).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, TextIO

import httpx

from services.common import cli_args, cli_argv, grpc_server
from services.common.config import StackConfig

logger = logging.getLogger(__name__)

READY_POLL_S = 0.25
SUPERVISE_POLL_S = 0.5
STOP_GRACE_S = 15.0
_PR_SET_PDEATHSIG = 1
LAUNCHER_PID_ENV = "DSV4SERVE_LAUNCHER_PID"


@dataclass(frozen=True)
class ChildSpec:
    """One service process: its command and how to tell that it is ready."""

    name: str
    command: list[str]
    is_ready: Callable[[], bool]
    ready_description: str


class StartupFailed(Exception):
    """A child exited or missed the deadline before the stack was ready; the message says which."""


class StopRequested(Exception):
    """SIGINT/SIGTERM arrived while the stack was starting."""


class Children:
    """Owns the running child processes (started in order, stopped in reverse order)."""

    def __init__(self, log_dir: Optional[Path], env: dict[str, str]) -> None:
        self._log_dir = log_dir
        self._env = env
        self._running: list[tuple[str, subprocess.Popen]] = []

    def start(self, spec: ChildSpec) -> subprocess.Popen:
        output = None
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            output = open(self._log_dir / f"{spec.name}.log", "ab")
        try:
            proc = subprocess.Popen(spec.command, env=self._env, stdout=output, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        finally:
            if output is not None:
                output.close()  # the child holds its own descriptor
        self._running.append((spec.name, proc))
        logger.info("started %s (pid %d)", spec.name, proc.pid)
        return proc

    def first_exited(self) -> Optional[tuple[str, int]]:
        for name, proc in self._running:
            if proc.poll() is not None:
                return name, proc.returncode
        return None

    def stop_all(self, grace_s: float) -> None:
        while self._running:
            name, proc = self._running.pop()
            _stop_process_group(name, proc, grace_s)


def follow_launcher(environ: dict[str, str] | os._Environ) -> None:
    """Called first thing in a child: ask for SIGTERM when the launcher dies, so nothing is orphaned.

    Done in the child rather than in a pre-exec hook because the launcher has threads (gRPC, httpx)
    by the time it starts the later children, and forking code must not run between fork and exec then.
    """
    launcher_pid = environ.get(LAUNCHER_PID_ENV)
    if launcher_pid is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(launcher_pid):  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _stop_process_group(name: str, proc: subprocess.Popen, grace_s: float) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %.0fs of SIGTERM; killing it", name, grace_s)
    # The child leads its own session: this also reaches processes it spawned (worker ranks).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    logger.info("%s stopped (status %s)", name, proc.returncode)


def wait_until_ready(spec: ChildSpec, proc: subprocess.Popen, deadline: float, stop: threading.Event) -> None:
    while not spec.is_ready():
        if proc.poll() is not None:
            raise StartupFailed(f"{spec.name} exited with status {proc.returncode} before it was ready")
        if stop.is_set():
            raise StopRequested()
        if time.monotonic() >= deadline:
            raise StartupFailed(f"{spec.name} was not ready ({spec.ready_description}) before the startup "
                                f"deadline; see its log")
        stop.wait(READY_POLL_S)


def supervise(specs: Sequence[ChildSpec], startup_timeout_s: float, log_dir: Optional[Path],
              stop: threading.Event, on_ready: Callable[[], None], grace_s: float = STOP_GRACE_S,
              env: Optional[dict[str, str]] = None) -> int:
    """Start `specs` in order, call `on_ready`, run until `stop` is set or a child exits; stop them all.

    Returns 0 after a requested stop, 1 when startup failed or a child exited on its own.
    """
    children = Children(log_dir, dict(os.environ) if env is None else env)
    deadline = time.monotonic() + startup_timeout_s
    try:
        for spec in specs:
            wait_until_ready(spec, children.start(spec), deadline, stop)
        on_ready()
        while not stop.wait(SUPERVISE_POLL_S):
            exited = children.first_exited()
            if exited is not None:
                logger.error("%s exited with status %d; stopping the stack", *exited)
                return 1
        return 0
    except StartupFailed as exc:
        logger.error("stack startup failed: %s", exc)
        return 1
    except StopRequested:
        logger.info("stop requested during startup")
        return 0
    finally:
        children.stop_all(grace_s)


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop` (instead of raising) while inside the block."""
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_supervised(specs: Sequence[ChildSpec], startup_timeout_s: float, log_dir: Optional[Path],
                   on_ready: Callable[[], None], env: Optional[dict[str, str]] = None) -> int:
    stop = threading.Event()
    with stop_on_signals(stop):
        return supervise(specs, startup_timeout_s, log_dir, stop, on_ready, env=env)


# ---- the dsv4serve stack ----

def run_stack(cfg: StackConfig, out: TextIO = sys.stdout) -> int:
    cfg = with_free_ports(cfg)
    if cfg.ready_file is not None:
        cfg.ready_file.unlink(missing_ok=True)  # it must only ever describe this run, while it is ready
    try:
        return run_supervised(child_specs(cfg), cfg.startup_timeout_s, cfg.log_dir,
                              on_ready=lambda: announce_ready(cfg, out),
                              env={**child_env(os.environ), **cli_argv.frontend_env(cfg.frontend)})
    finally:
        if cfg.ready_file is not None:
            cfg.ready_file.unlink(missing_ok=True)


def child_specs(cfg: StackConfig) -> list[ChildSpec]:
    worker_address = f"{cfg.worker.host}:{cfg.worker.port}"
    scheduler_address = f"{cfg.scheduler.host}:{cfg.scheduler.port}"
    health_url = f"{frontend_url(cfg)}/health"
    return [
        ChildSpec("worker", _service_command("worker", cli_argv.worker_argv(cfg.worker)),
                  lambda: _grpc_serving(worker_address, "dsv4serve.v1.Worker"),
                  f"gRPC health SERVING at {worker_address}"),
        ChildSpec("scheduler", _service_command("scheduler", cli_argv.scheduler_argv(cfg.scheduler)),
                  lambda: _grpc_serving(scheduler_address, "dsv4serve.v1.Scheduler"),
                  f"gRPC health SERVING at {scheduler_address}"),
        ChildSpec("frontend", _service_command("frontend", cli_argv.frontend_argv(cfg.frontend)),
                  lambda: _http_ok(health_url), f"GET {health_url} → 200"),
    ]


def _service_command(name: str, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "services.cli", name, *argv]


def _grpc_serving(address: str, service: str) -> bool:
    """The whole server or the named service reports SERVING (either is how a service may say it)."""
    return grpc_server.probe_health(address, "", 1.0) or grpc_server.probe_health(address, service, 1.0)


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0, trust_env=False).status_code == 200  # no proxy for a local probe
    except httpx.HTTPError:
        return False


def child_env(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The children's environment: PYPTO_* removed (the launcher already warned about them)."""
    env = {k: v for k, v in environ.items() if not k.startswith(cli_args.NPU_ONLY_ENV_PREFIX)}
    env["PYTHONUNBUFFERED"] = "1"
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    return env


def with_free_ports(cfg: StackConfig) -> StackConfig:
    """Replace every port 0 by a free port and wire the addresses the children use to reach each other."""
    wanted = [(cfg.frontend.host, cfg.frontend.port), (cfg.scheduler.host, cfg.scheduler.port),
              (cfg.worker.host, cfg.worker.port)]
    frontend_port, scheduler_port, worker_port = _free_ports(wanted)
    return replace(
        cfg,
        worker=replace(cfg.worker, port=worker_port),
        scheduler=replace(cfg.scheduler, port=scheduler_port,
                          worker_addresses=(f"{cfg.worker.host}:{worker_port}",)),
        frontend=replace(cfg.frontend, port=frontend_port,
                         scheduler_address=f"{cfg.scheduler.host}:{scheduler_port}"),
    )


def _free_ports(wanted: list[tuple[str, int]]) -> list[int]:
    # All probe sockets stay open until every port is chosen, so no two services get the same one.
    with contextlib.ExitStack() as sockets:
        ports = []
        for host, port in wanted:
            if port != 0:
                ports.append(port)
                continue
            sock = sockets.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def frontend_url(cfg: StackConfig) -> str:
    host = cfg.frontend.host
    reachable = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"http://{reachable}:{cfg.frontend.port}"


def announce_ready(cfg: StackConfig, out: TextIO) -> None:
    url = frontend_url(cfg)
    scheduler_address = f"{cfg.scheduler.host}:{cfg.scheduler.port}"
    worker_address = f"{cfg.worker.host}:{cfg.worker.port}"
    body = json.dumps({"model": cfg.frontend.served_model_name,
                       "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32})
    print(f"dsv4serve stack is ready: {url}  (model {cfg.frontend.served_model_name})\n"
          f"  scheduler {scheduler_address}  (grpcurl -plaintext {scheduler_address} list)\n"
          f"  worker    {worker_address}\n"
          f"Try:\n  curl {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'\n"
          f"Stop with Ctrl-C.", file=out, flush=True)
    if cfg.ready_file is not None:
        ready = {"base_url": url, "scheduler_address": scheduler_address, "worker_address": worker_address,
                 "served_model_name": cfg.frontend.served_model_name}
        tmp = cfg.ready_file.with_name(cfg.ready_file.name + ".tmp")
        tmp.write_text(json.dumps(ready))
        tmp.replace(cfg.ready_file)  # atomic: a reader never sees half a file
