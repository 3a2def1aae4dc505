"""Supervision of the launcher's child processes: start in order, watch, restart or stop them.

Start order is the order of the specs, each waited on by its own readiness check under one startup
deadline. Afterwards a child that exits on its own either stops the rest (exit 1) or, with a
`RestartPolicy`, is started again after a backoff and waited on until ready, while the others keep
serving; the reason (its exit status) is logged. A child that keeps failing — more restarts within
the policy's window than it allows — stops the stack after all. Stopping goes in reverse order:
SIGTERM, a grace period, then SIGKILL to the child's whole process group, so processes a child
spawned (worker ranks) never outlive it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

logger = logging.getLogger("services.launcher")

READY_POLL_S = 0.25
SUPERVISE_POLL_S = 0.5
STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class ChildSpec:
    """One service process: its command and how to tell that it is ready."""

    name: str
    command: list[str]
    is_ready: Callable[[], bool]
    ready_description: str


@dataclass(frozen=True)
class RestartPolicy:
    """`--restart-on-failure`: at most `max_restarts` restarts of one child within `window_s`;
    the n-th restart in that window waits `first_backoff_s · 2^(n-1)`, at most `max_backoff_s`."""

    max_restarts: int = 5
    window_s: float = 600.0
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def backoff_s(self, restarts_in_window: int) -> float:
        return min(self.first_backoff_s * 2 ** (restarts_in_window - 1), self.max_backoff_s)


class StartupFailed(Exception):
    """A child exited or missed the deadline before it was ready; the message says which."""


class StopRequested(Exception):
    """SIGINT/SIGTERM arrived while a child was starting."""


class Children:
    """Owns the running child processes (started in order, stopped in reverse order)."""

    def __init__(self, log_dir: Optional[Path], env: dict[str, str]) -> None:
        self._log_dir = log_dir
        self._env = env
        self._running: list[tuple[ChildSpec, subprocess.Popen]] = []

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
        self._running.append((spec, proc))
        logger.info("started %s (pid %d)", spec.name, proc.pid)
        return proc

    def restart(self, spec: ChildSpec, grace_s: float) -> subprocess.Popen:
        """Start `spec` again in its place in the stop order (the exited process is reaped)."""
        index = next(i for i, (s, _) in enumerate(self._running) if s is spec)
        _stop_process_group(spec.name, self._running.pop(index)[1], grace_s)
        proc = self.start(spec)
        self._running.insert(index, self._running.pop())
        return proc

    def first_exited(self) -> Optional[tuple[ChildSpec, int]]:
        for spec, proc in self._running:
            if proc.poll() is not None:
                return spec, proc.returncode
        return None

    def pids(self) -> dict[str, int]:
        return {spec.name: proc.pid for spec, proc in self._running}

    def stop_all(self, grace_s: float) -> None:
        while self._running:
            spec, proc = self._running.pop()
            _stop_process_group(spec.name, proc, grace_s)


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


class _Restarts:
    """Restart times of each child inside the policy's window."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._times: dict[str, deque[float]] = {}

    def record(self, name: str) -> Optional[int]:
        """Counts a restart of `name`; its number in the window, or None when over the cap."""
        now = time.monotonic()
        times = self._times.setdefault(name, deque())
        while times and now - times[0] > self.policy.window_s:
            times.popleft()
        if len(times) >= self.policy.max_restarts:
            return None
        times.append(now)
        return len(times)


def supervise(specs: Sequence[ChildSpec], startup_timeout_s: float, log_dir: Optional[Path],
              stop: threading.Event, on_ready: Callable[[], None], grace_s: float = STOP_GRACE_S,
              env: Optional[dict[str, str]] = None, restart: Optional[RestartPolicy] = None,
              on_children: Callable[[dict[str, int]], None] = lambda pids: None) -> int:
    """Start `specs` in order, call `on_ready`, run until `stop` is set or a child exits (or, with
    `restart`, keeps failing); stop them all. `on_children(pids)` follows `on_ready` and each restart.

    Returns 0 after a requested stop, 1 when startup failed or a child exited for good.
    """
    children = Children(log_dir, dict(os.environ) if env is None else env)
    deadline = time.monotonic() + startup_timeout_s
    try:
        for spec in specs:
            wait_until_ready(spec, children.start(spec), deadline, stop)
        on_ready()
        on_children(children.pids())
        return _watch(children, stop, startup_timeout_s, grace_s, restart, on_children)
    except StartupFailed as exc:
        logger.error("stack startup failed: %s", exc)
        return 1
    except StopRequested:
        logger.info("stop requested during startup")
        return 0
    finally:
        children.stop_all(grace_s)


def _watch(children: Children, stop: threading.Event, startup_timeout_s: float, grace_s: float,
           restart: Optional[RestartPolicy], on_children: Callable[[dict[str, int]], None]) -> int:
    restarts = _Restarts(restart) if restart is not None else None
    while not stop.wait(SUPERVISE_POLL_S):
        exited = children.first_exited()
        if exited is None:
            continue
        spec, status = exited
        number = restarts.record(spec.name) if restarts is not None else None
        if number is None:
            why = "" if restarts is None else (f" (restarted {restarts.policy.max_restarts} times within "
                                               f"{restarts.policy.window_s:g}s already)")
            logger.error("%s exited with status %d%s; stopping the stack", spec.name, status, why)
            return 1
        backoff_s = restarts.policy.backoff_s(number)
        logger.warning("%s exited with status %d; restarting it in %gs (restart %d of at most %d "
                       "within %gs)", spec.name, status, backoff_s, number,
                       restarts.policy.max_restarts, restarts.policy.window_s)
        if stop.wait(backoff_s):
            return 0
        proc = children.restart(spec, grace_s)
        wait_until_ready(spec, proc, time.monotonic() + startup_timeout_s, stop)
        logger.info("%s is ready again (pid %d)", spec.name, proc.pid)
        on_children(children.pids())
    return 0


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
                   on_ready: Callable[[], None], env: Optional[dict[str, str]] = None,
                   grace_s: float = STOP_GRACE_S, restart: Optional[RestartPolicy] = None,
                   on_children: Callable[[dict[str, int]], None] = lambda pids: None) -> int:
    stop = threading.Event()
    with stop_on_signals(stop):
        return supervise(specs, startup_timeout_s, log_dir, stop, on_ready, grace_s, env, restart,
                         on_children)
