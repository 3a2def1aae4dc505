"""docker/docker-compose.yml, run for real under podman-compose with three frontend replicas: what the
README promises an operator of the containers. The tests share one running project per compose file
and run in this order; the last one tears it down and checks that nothing is left behind."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.containers.compose_stack import FRONTEND_REPLICAS, RunningStack, http_status
from tests.containers.conftest import COMPOSE_FILES
from tests.e2e.helpers import describe_usage, grpcurl_path, is_idle, scheduler_state, wait_for

pytestmark = [pytest.mark.containers, pytest.mark.slow]
# Restart policies and frontend replicas are the same services in every compose file: their tests run
# on the single-worker file only; the 16-rank file is held to serving, grpcurl, the operators' check,
# idleness and a clean teardown (a worker process lost under 16 ranks: tests/e2e/test_sixteen_ranks_e2e.py).
single_worker_file_only = pytest.mark.parametrize("running", [COMPOSE_FILES[0]], indirect=True,
                                                  ids=lambda path: path.name)
RECOVERY_TIMEOUT_S = 240
CHECK_TIMEOUT_S = 900


def chat(url: str) -> dict:
    """One short chat request through the replica at url; its parsed 200 response."""
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        response = client.post("/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8})
    assert response.status_code == 200, f"{url}: {response.status_code} {response.text[:500]}"
    return response.json()


def assert_answers(url: str) -> None:
    body = chat(url)
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert body["usage"]["completion_tokens"] > 0


def test_every_frontend_replica_answers_on_its_own_published_port(running: RunningStack) -> None:
    urls = list(running.frontend_urls.values())
    assert len(urls) == FRONTEND_REPLICAS and len(set(urls)) == FRONTEND_REPLICAS
    for url in urls:
        assert_answers(url)


def grpcurl(address: str, verb: str, *flags: str) -> str:
    """`grpcurl -plaintext FLAGS ADDRESS VERB` (VERB: `list` or a method); its stdout."""
    done = subprocess.run([grpcurl_path(), "-plaintext", *flags, address, verb],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_grpcurl_lists_the_scheduler_and_reads_its_state_on_the_published_port(
        running: RunningStack) -> None:
    listed = grpcurl(running.scheduler_address, "list").split()
    assert {"dsv4serve.v1.Scheduler", "grpc.health.v1.Health"} <= set(listed)
    state = json.loads(grpcurl(running.scheduler_address, "dsv4serve.v1.Scheduler/GetSchedulerState",
                               "-d", '{"include_requests": true}'))
    workers = state["workers"]
    assert len(workers) == len(running.roles["worker"]) and all(w["connected"] for w in workers)
    assert state["partitions"]


@single_worker_file_only
@pytest.mark.parametrize("role", ["worker", "scheduler"])
def test_a_crashed_service_turns_health_503_until_its_restart_policy_brings_it_back(
        running: RunningStack, role: str) -> None:
    stack = running.stack
    container = stack.containers(running.roles[role][0])[0]
    restarts_before = int(stack.inspect(container, ".RestartCount"))
    health_url = next(iter(running.frontend_urls.values()))

    stack.crash(container)

    assert wait_for(lambda: http_status(health_url) == 503, 60, interval_s=0.1), \
        f"/health never reported the {role} crash"
    recovered = wait_for(lambda: all(http_status(url) == 200 for url in running.frontend_urls.values()),
                         RECOVERY_TIMEOUT_S, interval_s=1.0)
    assert recovered, f"no recovery within {RECOVERY_TIMEOUT_S}s\n{stack.logs()}"
    assert int(stack.inspect(container, ".RestartCount")) == restarts_before + 1
    assert_answers(health_url)


def test_dsv4serve_check_passes_against_a_replica(running: RunningStack) -> None:
    url = list(running.frontend_urls.values())[1]
    done = subprocess.run([sys.executable, "-m", "services.cli", "check", "--url", url],
                          capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    assert done.returncode == 0, \
        f"dsv4serve check --url {url} exited {done.returncode}:\n{done.stdout}{done.stderr}"


@single_worker_file_only
def test_killing_one_frontend_replica_leaves_the_others_serving(running: RunningStack) -> None:
    victim, *others = running.stack.containers("frontend")
    running.stack.stop(victim)

    assert http_status(running.frontend_urls[victim.name]) == 0
    for other in others:
        assert_answers(running.frontend_urls[other.name])


def test_the_scheduler_is_idle_after_all_the_traffic(running: RunningStack) -> None:
    address = running.scheduler_address
    assert wait_for(lambda: is_idle(scheduler_state(address)), 30, interval_s=0.2), \
        describe_usage(scheduler_state(address))


def test_compose_down_leaves_no_containers_pods_networks_or_volumes(running: RunningStack) -> None:
    assert running.stack.leftovers(), "the project should exist before its teardown"
    running.stack.down()
    assert running.stack.leftovers() == []
