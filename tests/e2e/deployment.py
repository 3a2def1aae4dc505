"""A multi-worker deployment as separate processes: N `dsv4serve worker`s driving slices of one
world, a scheduler connected to all of them and a frontend, each on free ports, so a test can kill
and restart one worker."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx

from tests.e2e.helpers import ServiceProcesses, free_port, health_status, wait_for

NAME = "dsv4-ep16-e2e"
READY_TIMEOUT_S = float(os.environ.get("DSV4SERVE_E2E_STARTUP_TIMEOUT", "240")) + 120


class Deployment(ServiceProcesses):
    stop_timeout_s = 60.0

    def __init__(self, model_dir: Path, log_dir: Path, topology: tuple[str, ...],
                 worker_ranks: tuple[str, ...], extra: tuple[str, ...] = ()) -> None:
        super().__init__(log_dir)
        self.model_dir = model_dir
        self.topology, self.worker_ranks, self.extra = topology, worker_ranks, extra
        self.worker_ports = [free_port() for _ in worker_ranks]
        self.scheduler_port, self.frontend_port, self.store_port = (free_port() for _ in range(3))
        self.base_url = f"http://127.0.0.1:{self.frontend_port}"
        self.scheduler_address = f"127.0.0.1:{self.scheduler_port}"

    def start_worker(self, index: int) -> None:
        self._start(f"worker{index}", "worker", [
            *self.topology, *self.extra, "--ranks", self.worker_ranks[index],
            "--dist-init-addr", f"127.0.0.1:{self.store_port}",
            "--port", str(self.worker_ports[index]), "--kv-cache-memory", "64MiB"])

    def start_all(self) -> None:
        for index in range(len(self.worker_ranks)):
            self.start_worker(index)
        workers = ",".join(f"127.0.0.1:{port}" for port in self.worker_ports)
        self._start("scheduler", "scheduler", [*self.extra, "--workers", workers,
                                               "--served-model-name", NAME,
                                               "--port", str(self.scheduler_port)])
        self._start("frontend", "frontend", ["--served-model-name", NAME,
                                             "--scheduler", self.scheduler_address,
                                             "--port", str(self.frontend_port)])

    def wait_healthy(self, status: int = 200, timeout_s: float = READY_TIMEOUT_S) -> bool:
        with httpx.Client(base_url=self.base_url, trust_env=False) as http:
            return bool(wait_for(lambda: health_status(http) == status, timeout_s, 0.2))

    def _start(self, name: str, service: str, args: list[str]) -> None:
        self.spawn(name, [sys.executable, "-m", "services.cli", service, "--model", str(self.model_dir),
                          "--host", "127.0.0.1", *args])
