"""The compose stack in containers: podman prepared, the image built (or reused), one project per
compose file brought up with three frontend replicas, and torn down at the end.

Each compose file under test is one parameter of `running`; a variant (e.g. two worker services) joins
by adding its file to COMPOSE_FILES. Image builds and base images are cached (see image_build.py), so
only the first run on a machine pays for debootstrap and the build.
"""
from __future__ import annotations

import secrets
from pathlib import Path
from typing import Iterator

import pytest

from tests.containers.compose_stack import (FRONTEND_REPLICAS, ComposeStack, RunningStack, http_status,
                                             service_roles)
from tests.containers.image_build import project_image
from tests.containers.podman_host import prepare_podman
from tests.e2e.helpers import free_port, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = [REPO_ROOT / "docker" / "docker-compose.yml",
                 REPO_ROOT / "docker" / "docker-compose.16rank.yml"]
STARTUP_TIMEOUT_S = 300


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    unavailable = prepare_podman()
    if unavailable:
        pytest.skip(unavailable)
    log = tmp_path_factory.mktemp("image") / "build.log"
    try:
        return project_image(log)
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)


def _bring_up(compose_file: Path, image: str, checkpoints: Path) -> RunningStack:
    scheduler_port = free_port()
    env = {"DSV4SERVE_IMAGE": image, "DSV4SERVE_SCHEDULER_PORT": str(scheduler_port),
           "DSV4SERVE_CHECKPOINTS": str(checkpoints)}
    stack = ComposeStack(compose_file, f"dsv4serve-ctest-{secrets.token_hex(4)}", env)
    stack.up(FRONTEND_REPLICAS)
    urls = {c.name: f"http://{stack.published(c, 8000)}" for c in stack.containers("frontend")}
    return RunningStack(stack, service_roles(compose_file), urls, f"127.0.0.1:{scheduler_port}")


@pytest.fixture(scope="module", params=COMPOSE_FILES, ids=lambda path: path.name)
def running(request: pytest.FixtureRequest, image: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    checkpoints = tmp_path_factory.mktemp("checkpoints")  # the compose file's read-only /checkpoints
    try:
        stack = _bring_up(request.param, image, checkpoints)
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)
    failed_before = request.session.testsfailed
    try:
        ready = wait_for(lambda: all(http_status(url) == 200 for url in stack.frontend_urls.values()),
                         STARTUP_TIMEOUT_S, interval_s=1.0)
        if not ready:
            pytest.fail(f"the stack was not healthy within {STARTUP_TIMEOUT_S}s\n{stack.stack.logs()}",
                        pytrace=False)
        yield stack
    finally:
        if request.session.testsfailed > failed_before:
            reporter = request.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_sep("=", f"container logs of {stack.stack.project}")
                reporter.write_line(stack.stack.logs())
        if stack.stack.leftovers():
            stack.stack.down()
