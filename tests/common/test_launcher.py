"""The stack launcher's supervision, with stand-in children (the real services are tested end to end).

Each stand-in is a tiny Python process that writes its pid, becomes "ready" by creating a file, and
then behaves as told: serve until SIGTERM, exit on its own, never get ready, ignore SIGTERM, or spawn
a grandchild (as a worker spawns its ranks).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from services import launcher, supervisor
from services.common import cli_args

REPO_ROOT = Path(__file__).resolve().parents[2]

STAND_IN = textwrap.dedent("""
    import os, signal, subprocess, sys
    from pathlib import Path
    workdir, name, behaviour, required = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    (workdir / f"{name}.pid").write_text(str(os.getpid()))
    if required != "-" and not (workdir / f"{required}.ready").exists():
        sys.exit(5)  # started before the service it depends on was ready
    if behaviour == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if behaviour == "spawn":
        child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        (workdir / f"{name}.grandchild").write_text(str(child.pid))
    if behaviour == "crash":
        sys.exit(2)
    if behaviour != "never-ready":
        (workdir / f"{name}.ready").write_text("")
    if behaviour == "exit":
        sys.exit(3)
    while True:
        signal.pause()
""")


def stand_in(workdir: Path, name: str, behaviour: str = "serve", requires: str = "-") -> supervisor.ChildSpec:
    ready = workdir / f"{name}.ready"
    return supervisor.ChildSpec(name, [sys.executable, "-c", STAND_IN, str(workdir), name, behaviour, requires],
                              ready.exists, f"{ready} exists")


def pid_of(workdir: Path, name: str, suffix: str = "pid") -> int:
    return int((workdir / f"{name}.{suffix}").read_text())


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def supervise(specs: list[supervisor.ChildSpec], tmp_path: Path, on_ready: Callable[[], None],
              stop: threading.Event, startup_timeout_s: float = 30.0, grace_s: float = 5.0) -> int:
    return supervisor.supervise(specs, startup_timeout_s, tmp_path / "logs", stop, on_ready, grace_s=grace_s)


def test_starts_in_order_and_stops_every_child_on_request(tmp_path: Path) -> None:
    specs = [stand_in(tmp_path, "worker"), stand_in(tmp_path, "scheduler", requires="worker"),
             stand_in(tmp_path, "frontend", requires="scheduler")]
    stop = threading.Event()
    seen_ready: list[bool] = []

    def on_ready() -> None:
        seen_ready.append(all((tmp_path / f"{s.name}.ready").exists() for s in specs))
        stop.set()

    assert supervise(specs, tmp_path, on_ready, stop) == 0
    assert seen_ready == [True]
    for spec in specs:
        assert not is_alive(pid_of(tmp_path, spec.name)), spec.name


def test_a_child_exiting_stops_the_rest_and_fails(tmp_path: Path) -> None:
    specs = [stand_in(tmp_path, "worker"), stand_in(tmp_path, "scheduler", behaviour="exit")]

    assert supervise(specs, tmp_path, lambda: None, threading.Event()) == 1
    assert not is_alive(pid_of(tmp_path, "worker"))


def test_a_crash_during_startup_names_the_child(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    specs = [stand_in(tmp_path, "worker", behaviour="crash"), stand_in(tmp_path, "scheduler")]

    with caplog.at_level(logging.ERROR, logger="services.launcher"):
        assert supervise(specs, tmp_path, lambda: pytest.fail("never ready"), threading.Event()) == 1
    assert "worker exited with status 2 before it was ready" in caplog.text
    assert not (tmp_path / "scheduler.pid").exists()


def test_startup_deadline_stops_everything(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    specs = [stand_in(tmp_path, "worker"), stand_in(tmp_path, "scheduler", behaviour="never-ready")]

    with caplog.at_level(logging.ERROR, logger="services.launcher"):
        assert supervise(specs, tmp_path, lambda: pytest.fail("never ready"), threading.Event(),
                         startup_timeout_s=1.0) == 1
    assert "scheduler was not ready" in caplog.text
    assert not is_alive(pid_of(tmp_path, "worker")) and not is_alive(pid_of(tmp_path, "scheduler"))


def test_a_child_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    stop = threading.Event()
    specs = [stand_in(tmp_path, "worker", behaviour="ignore-term")]

    assert supervise(specs, tmp_path, stop.set, stop, grace_s=0.5) == 0
    assert not is_alive(pid_of(tmp_path, "worker"))


def test_processes_a_child_spawned_do_not_outlive_it(tmp_path: Path) -> None:
    stop = threading.Event()
    specs = [stand_in(tmp_path, "worker", behaviour="spawn")]

    assert supervise(specs, tmp_path, stop.set, stop) == 0
    grandchild = pid_of(tmp_path, "worker", "grandchild")
    assert wait_for(lambda: not is_alive(grandchild)), "a rank-like grandchild outlived the stack"


def test_children_output_goes_to_per_service_logs(tmp_path: Path) -> None:
    stop = threading.Event()
    spec = supervisor.ChildSpec("worker", [sys.executable, "-c", "print('hello from the worker')"],
                              lambda: False, "never")

    assert supervise([spec], tmp_path, stop.set, stop) == 1
    assert (tmp_path / "logs" / "worker.log").read_text() == "hello from the worker\n"


SIGNALLED_LAUNCHER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from services import supervisor
    sys.path.insert(0, sys.argv[2])
    from test_launcher import stand_in
    workdir = Path(sys.argv[1])
    specs = [stand_in(workdir, "worker"), stand_in(workdir, "frontend", requires="worker")]
    sys.exit(supervisor.run_supervised(specs, 30.0, workdir / "logs", lambda: print("ready", flush=True)))
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_stack_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SIGNALLED_LAUNCHER, str(tmp_path), str(Path(__file__).parent)],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not is_alive(pid_of(tmp_path, "worker")) and not is_alive(pid_of(tmp_path, "frontend"))


def test_port_zero_becomes_distinct_free_ports_wired_between_services() -> None:
    stack = cli_args.parse_stack_args(["--model", "/m", "--port", "0", "--scheduler-port", "0",
                                       "--worker-port", "0"], environ={}, default_model_dir=lambda: Path("/m"))
    resolved = launcher.with_free_ports(stack)

    ports = {resolved.frontend.port, resolved.scheduler.port, resolved.worker.port}
    assert len(ports) == 3 and 0 not in ports
    assert resolved.scheduler.worker_addresses == (f"127.0.0.1:{resolved.worker.port}",)
    assert resolved.frontend.scheduler_address == f"127.0.0.1:{resolved.scheduler.port}"


def test_auto_ports_lie_below_the_kernels_ephemeral_range(tmp_path: Path) -> None:
    """A port chosen there cannot be handed to a bind(0) or an outgoing connection before its
    service binds it."""
    stack = cli_args.parse_stack_args(["--model", "/m", "--port", "0", "--scheduler-port", "0",
                                       "--worker-port", "0"], environ={}, default_model_dir=lambda: Path("/m"))
    resolved = launcher.with_free_ports(stack)
    first = int(launcher.EPHEMERAL_RANGE_FILE.read_text().split()[0])
    for port in (resolved.frontend.port, resolved.scheduler.port, resolved.worker.port):
        assert port < first and port in launcher.auto_port_range()
    odd = tmp_path / "range"
    odd.write_text("40000\t60999\n")
    assert launcher.auto_port_range(odd) == range(20000, 40000)
    odd.write_text("2000 60999\n")
    assert launcher.auto_port_range(odd) == range(1024, 2000)


def test_explicit_ports_are_kept() -> None:
    stack = cli_args.parse_stack_args(["--model", "/m"], environ={}, default_model_dir=lambda: Path("/m"))
    assert launcher.with_free_ports(stack) == stack


def test_ready_announcement_prints_a_curl_and_writes_the_ready_file(tmp_path: Path) -> None:
    ready_file = tmp_path / "ready.json"
    stack = cli_args.parse_stack_args(["--model", "/models/tiny-a", "--port", "8123", "--ready-file", str(ready_file)],
                                      environ={}, default_model_dir=lambda: Path("/m"))
    printed = tmp_path / "out.txt"
    with printed.open("w") as out:
        launcher.announce_ready(stack, out)
    launcher.write_ready_file(stack, {"worker": 11, "scheduler": 12, "frontend": 13})

    text = printed.read_text()
    assert "http://127.0.0.1:8123" in text and "curl http://127.0.0.1:8123/v1/chat/completions" in text
    assert json.loads(ready_file.read_text()) == {
        "base_url": "http://127.0.0.1:8123", "scheduler_address": "127.0.0.1:50051",
        "worker_address": "127.0.0.1:50061", "served_model_name": "tiny-a",
        "pids": {"worker": 11, "scheduler": 12, "frontend": 13}}


def test_children_run_the_services_through_the_cli_with_their_own_flags() -> None:
    stack = cli_args.parse_stack_args(["--model", "/m", "--dp", "2", "--ep", "2"], environ={},
                                      default_model_dir=lambda: Path("/m"))
    commands = {spec.name: spec.command for spec in launcher.child_specs(stack)}

    assert list(commands) == ["worker", "scheduler", "frontend"]
    for name, command in commands.items():
        assert command[:4] == [sys.executable, "-m", "services.cli", name]
    assert cli_args.parse_worker_args(commands["worker"][4:], environ={}) == stack.worker
    assert cli_args.parse_frontend_args(commands["frontend"][4:], environ={}) == stack.frontend


def test_children_do_not_inherit_npu_variables_and_know_their_launcher() -> None:
    env = launcher.child_env({"PYPTO_CACHE": "1", "PATH": "/bin"})
    assert "PYPTO_CACHE" not in env and env["PATH"] == "/bin"
    assert env[launcher.LAUNCHER_PID_ENV] == str(os.getpid())


DOOMED_LAUNCHER = textwrap.dedent("""
    import os, signal, subprocess, sys
    from services import launcher
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, signal; from services.launcher import follow_launcher; "
         "follow_launcher(os.environ); print('armed', flush=True); signal.pause()"],
        env={**os.environ, launcher.LAUNCHER_PID_ENV: str(os.getpid())}, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "armed"
    print(child.pid, flush=True)
    signal.pause()
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux-only")
def test_a_service_stops_when_its_launcher_is_killed(tmp_path: Path) -> None:
    doomed = subprocess.Popen([sys.executable, "-c", DOOMED_LAUNCHER], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        service_pid = int(doomed.stdout.readline())
        assert is_alive(service_pid)
        doomed.kill()  # SIGKILL: the launcher gets no chance to stop anything itself
        doomed.wait()
        assert wait_for(lambda: not is_alive(service_pid)), "the service outlived its killed launcher"
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait()


FAST_RESTARTS = supervisor.RestartPolicy(max_restarts=2, window_s=60.0, first_backoff_s=0.05,
                                         max_backoff_s=0.1)


def test_restart_on_failure_restarts_a_killed_child_and_keeps_the_others(tmp_path: Path) -> None:
    specs = [stand_in(tmp_path, "worker"), stand_in(tmp_path, "frontend", requires="worker")]
    stop = threading.Event()
    seen_pids: list[dict[str, int]] = []

    def on_children(pids: dict[str, int]) -> None:
        seen_pids.append(pids)
        if len(seen_pids) == 1:
            os.kill(pids["worker"], signal.SIGKILL)
        else:
            stop.set()

    status = supervisor.supervise(specs, 30.0, tmp_path / "logs", stop, lambda: None, grace_s=5.0,
                                  restart=FAST_RESTARTS, on_children=on_children)
    assert status == 0
    first, second = seen_pids
    assert second["worker"] != first["worker"] and second["frontend"] == first["frontend"]
    assert not is_alive(second["worker"]) and not is_alive(second["frontend"])


def test_restart_on_failure_gives_up_after_the_cap_and_logs_why(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    restarted: list[dict[str, int]] = []
    with caplog.at_level(logging.INFO):
        status = supervisor.supervise([stand_in(tmp_path, "worker", "exit")], 30.0, tmp_path / "logs",
                                      threading.Event(), lambda: None, grace_s=5.0,
                                      restart=FAST_RESTARTS, on_children=restarted.append)
    assert status == 1
    assert len(restarted) == 1 + FAST_RESTARTS.max_restarts
    assert "worker exited with status 3; restarting it" in caplog.text
    assert "restarted 2 times within 60s already" in caplog.text


def test_restart_backoff_doubles_up_to_its_maximum() -> None:
    policy = supervisor.RestartPolicy(first_backoff_s=1.0, max_backoff_s=30.0)
    assert [policy.backoff_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
