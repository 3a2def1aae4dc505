"""A compose project run by podman-compose: up, where each container listens, crashes, teardown.

Roles come from the compose file itself (the subcommand each service runs), so a variant with more
worker services runs through the same tests. podman-compose labels everything it creates with
`io.podman.compose.project=<project>`; the teardown check looks for that label and for the names it
derives from the project (`pod_<project>`, `<project>_default`).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.containers.podman_host import podman

COMPOSE_TIMEOUT_S = 300
FRONTEND_REPLICAS = 3
LOG_TAIL_CHARS = 4000


def service_roles(compose_file: Path) -> dict[str, list[str]]:
    """{"worker": [services…], "scheduler": […], "frontend": […]} from each service's command."""
    roles: dict[str, list[str]] = {"worker": [], "scheduler": [], "frontend": []}
    for name, service in yaml.safe_load(compose_file.read_text())["services"].items():
        roles[service["command"][1]].append(name)
    return roles


@dataclass(frozen=True)
class Container:
    name: str
    service: str
    number: int


class ComposeStack:
    def __init__(self, compose_file: Path, project: str, env: dict[str, str]) -> None:
        self.compose_file = compose_file
        self.project = project
        self.env = env
        self.label = f"label=io.podman.compose.project={project}"

    def compose(self, *args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "podman_compose", "-p", self.project,
                   "-f", str(self.compose_file), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPOSE_TIMEOUT_S,
                              env={**os.environ, **self.env}, cwd=self.compose_file.parent)
        if done.returncode != 0:
            raise RuntimeError(f"podman-compose {' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def up(self, frontend_replicas: int) -> None:
        self.compose("up", "-d", "--no-build", "--scale", f"frontend={frontend_replicas}")

    def down(self) -> None:
        """Stop and remove everything of the project. --remove-orphans is what reaches the replicas
        beyond the first: podman-compose's down only knows the unscaled container list."""
        self.compose("down", "--volumes", "--remove-orphans")

    def containers(self, service: str | None = None) -> list[Container]:
        listed = json.loads(podman("ps", "-a", "--filter", self.label, "--format", "json").stdout or "[]")
        found = [Container(c["Names"][0], c["Labels"]["com.docker.compose.service"],
                           int(c["Labels"]["com.docker.compose.container-number"])) for c in listed]
        chosen = (c for c in found if service in (None, c.service))
        return sorted(chosen, key=lambda c: (c.service, c.number))

    def published(self, container: Container, port: int) -> str:
        """host:port where the container's `port` is published (0.0.0.0 reads as 127.0.0.1)."""
        address = podman("port", container.name, str(port)).stdout.split()[0]
        host, _, host_port = address.rpartition(":")
        return f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{host_port}"

    def inspect(self, container: Container, field: str) -> str:
        return podman("inspect", container.name, "--format", "{{" + field + "}}").stdout.strip()

    def crash(self, container: Container) -> None:
        """SIGKILL the container's main process from the host, as an OOM kill or a crash would end it
        (unlike `podman kill`, which podman counts as a deliberate stop and never restarts)."""
        os.kill(int(self.inspect(container, ".State.Pid")), signal.SIGKILL)

    def stop(self, container: Container) -> None:
        """Kill a container for good: podman records it as stopped by the user, so no restart."""
        podman("kill", container.name)

    def logs(self) -> str:
        parts = []
        for container in self.containers():
            done = podman("logs", container.name, check=False)
            parts.append(f"----- {container.name} (last {LOG_TAIL_CHARS} chars) -----\n"
                         f"{(done.stdout + done.stderr)[-LOG_TAIL_CHARS:]}")
        return "\n".join(parts) or "(no containers)"

    def leftovers(self) -> list[str]:
        """Whatever of the project still exists: containers, pods, networks, volumes."""
        queries = {
            "container": ["ps", "-a", "--filter", self.label, "--format", "{{.Names}}"],
            "pod": ["pod", "ls", "--filter", f"name=^pod_{self.project}$", "--format", "{{.Name}}"],
            "network": ["network", "ls", "--format", "{{.Name}}"],
            "volume": ["volume", "ls", "--filter", self.label, "--format", "{{.Name}}"],
        }
        found = []
        for kind, args in queries.items():
            names = podman(*args).stdout.split()
            if kind == "network":
                names = [n for n in names if n.startswith(f"{self.project}_")]
            found += [f"{kind} {name}" for name in names]
        return found


@dataclass(frozen=True)
class RunningStack:
    stack: ComposeStack
    roles: dict[str, list[str]]
    frontend_urls: dict[str, str]  # container name → http://127.0.0.1:PORT
    scheduler_address: str         # 127.0.0.1:PORT, published


def http_status(url: str, path: str = "/health") -> int:
    """GET url+path's status code, 0 when nothing answers."""
    try:
        return httpx.get(url + path, timeout=10, trust_env=False).status_code
    except httpx.TransportError:
        return 0
