"""`dsv4serve stack`: worker, scheduler and frontend as three local child processes.

Start order is worker → scheduler → frontend, each waited on by its own readiness check (gRPC health
SERVING — over TLS when the stack has certificates — then HTTP /health 200) under one startup
deadline. Afterwards the launcher only supervises (`supervisor.py`): Ctrl-C / SIGTERM stops the stack
cleanly (exit 0); a child that exits on its own stops the rest (exit 1), or with
`--restart-on-failure` is restarted (capped, with backoff). Stopping goes in reverse order, each child
getting its own shutdown grace plus a margin before SIGKILL. A child started by the launcher also gets
SIGTERM if the launcher itself dies (`follow_launcher`, Linux parent-death signal).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import random
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import httpx

from services.common import cli_args, cli_argv, grpc_server
from services.common.config import StackConfig, TlsConfig
from services.supervisor import ChildSpec, RestartPolicy, run_supervised

logger = logging.getLogger(__name__)

# Beyond a child's own --shutdown-grace-s: the frontend's flush of error events and process exit.
STOP_MARGIN_S = 10.0
_PR_SET_PDEATHSIG = 1
LAUNCHER_PID_ENV = "DSV4SERVE_LAUNCHER_PID"


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


# ---- the dsv4serve stack ----

def run_stack(cfg: StackConfig, out: TextIO = sys.stdout) -> int:
    cfg = with_free_ports(cfg)
    if cfg.ready_file is not None:
        cfg.ready_file.unlink(missing_ok=True)  # it must only ever describe this run, while it is ready
    graces = (cfg.worker.ops.shutdown_grace_s, cfg.scheduler.ops.shutdown_grace_s,
              cfg.frontend.ops.shutdown_grace_s)
    try:
        return run_supervised(child_specs(cfg), cfg.startup_timeout_s, cfg.log_dir,
                              on_ready=lambda: announce_ready(cfg, out),
                              env={**child_env(os.environ), **cli_argv.frontend_env(cfg.frontend)},
                              grace_s=max(graces) + STOP_MARGIN_S,
                              restart=RestartPolicy() if cfg.restart_on_failure else None,
                              on_children=lambda pids: write_ready_file(cfg, pids))
    finally:
        if cfg.ready_file is not None:
            cfg.ready_file.unlink(missing_ok=True)


def child_specs(cfg: StackConfig) -> list[ChildSpec]:
    worker_address = f"{cfg.worker.host}:{cfg.worker.port}"
    scheduler_address = f"{cfg.scheduler.host}:{cfg.scheduler.port}"
    health_url = f"{frontend_url(cfg)}/health"
    tls = cfg.scheduler.ops.tls  # the stack's one identity, which the worker also accepts
    return [
        ChildSpec("worker", _service_command("worker", cli_argv.worker_argv(cfg.worker)),
                  lambda: _grpc_serving(worker_address, "dsv4serve.v1.Worker", tls),
                  f"gRPC health SERVING at {worker_address}"),
        ChildSpec("scheduler", _service_command("scheduler", cli_argv.scheduler_argv(cfg.scheduler)),
                  lambda: _grpc_serving(scheduler_address, "dsv4serve.v1.Scheduler", tls),
                  f"gRPC health SERVING at {scheduler_address}"),
        ChildSpec("frontend", _service_command("frontend", cli_argv.frontend_argv(cfg.frontend)),
                  lambda: _http_ok(health_url), f"GET {health_url} → 200"),
    ]


def _service_command(name: str, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "services.cli", name, *argv]


def _grpc_serving(address: str, service: str, tls: TlsConfig) -> bool:
    """The whole server or the named service reports SERVING (either is how a service may say it)."""
    return (grpc_server.probe_health(address, "", 1.0, tls)
            or grpc_server.probe_health(address, service, 1.0, tls))


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


# Auto ports come from below the kernel's ephemeral range: a port picked there and released
# until its service binds it could meanwhile be handed to any bind(0) or outgoing connection —
# the worker's own gloo sockets among them (a test stack's scheduler once lost its port so).
# Below the range only an explicit bind can take it.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
AUTO_PORTS_BELOW_RANGE = 20000     # how far below the range's start auto ports are drawn
AUTO_PORT_TRIES = 200


def _free_ports(wanted: list[tuple[str, int]]) -> list[int]:
    # All probe sockets stay open until every port is chosen, so no two services get the same one.
    with contextlib.ExitStack() as sockets:
        ports = []
        for host, port in wanted:
            if port != 0:
                ports.append(port)
                continue
            sock = sockets.enter_context(bind_auto_port(host))
            ports.append(sock.getsockname()[1])
        return ports


def auto_port_range(range_file: Path = EPHEMERAL_RANGE_FILE) -> range:
    """The ports auto ports are drawn from: below the kernel's ephemeral range (Linux's
    32768–60999 when the file cannot be read), never below 1024."""
    try:
        first = int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768
    return range(max(1024, first - AUTO_PORTS_BELOW_RANGE), first)


def bind_auto_port(host: str) -> socket.socket:
    """A socket bound to a free port of `auto_port_range`, or to an ephemeral one (bind to 0)
    when that range is empty or every try there is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    candidates = auto_port_range()
    for _ in range(AUTO_PORT_TRIES if len(candidates) else 0):
        try:
            sock.bind((host, random.choice(candidates)))
            return sock
        except OSError:
            continue
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


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
          f"  scheduler {scheduler_address}  (grpcurl {_grpcurl_security(cfg.scheduler.ops.tls)} "
          f"{scheduler_address} list)\n"
          f"  worker    {worker_address}\n"
          f"Try:\n  curl {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'\n"
          f"Stop with Ctrl-C.", file=out, flush=True)


def _grpcurl_security(tls: TlsConfig) -> str:
    if not tls.dials_tls:
        return "-plaintext"
    flags = [f"-cacert {tls.ca_file}"] if tls.ca_file else []
    if tls.cert_file is not None:
        flags += [f"-cert {tls.cert_file}", f"-key {tls.key_file}"]
    return " ".join(flags)


def write_ready_file(cfg: StackConfig, pids: dict[str, int]) -> None:
    """{"base_url", "scheduler_address", "worker_address", "served_model_name", "pids"}; rewritten
    after a restart (new pids). Atomic: a reader never sees half a file."""
    if cfg.ready_file is None:
        return
    ready = {"base_url": frontend_url(cfg), "scheduler_address": f"{cfg.scheduler.host}:{cfg.scheduler.port}",
             "worker_address": f"{cfg.worker.host}:{cfg.worker.port}",
             "served_model_name": cfg.frontend.served_model_name, "pids": pids}
    tmp = cfg.ready_file.with_name(cfg.ready_file.name + ".tmp")
    tmp.write_text(json.dumps(ready))
    tmp.replace(cfg.ready_file)
