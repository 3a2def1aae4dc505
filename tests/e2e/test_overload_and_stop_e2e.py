"""Back-pressure, graceful stop and restarts of the real stack (`--restart-on-failure`).

One stack for the module, with a small queue bound (`--max-waiting-requests 32`, `--max-num-seqs 8`)
and a short shutdown grace. The tests run in file order: the overload burst first, then SIGTERM to
the frontend (which the launcher restarts), then SIGKILL to the worker (restarted too).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.e2e.conftest import RunningStack, launch_stack
from tests.e2e.helpers import describe_usage, health_status, is_idle, scheduler_state, wait_for

pytestmark = pytest.mark.slow

MAX_WAITING = 32
GRACE_S = 15.0  # the short streams must finish within it even on a loaded 2-core machine
RESTART_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def busy_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    flags = ("--max-num-seqs", "8", "--max-waiting-requests", str(MAX_WAITING),
             "--shutdown-grace-s", str(GRACE_S), "--restart-on-failure")
    yield from launch_stack(tiny_model_dir, tmp_path_factory.mktemp("busy-stack"), request, flags)


def chat(stack: RunningStack, max_tokens: int, stream: bool, **extra) -> dict:
    return {"model": stack.served_model_name, "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": max_tokens, "stream": stream, **extra}


async def one_request(client: httpx.AsyncClient, body: dict) -> tuple[int, dict[str, str], list[str]]:
    """Status, headers, and the SSE data lines (or the JSON body as one line)."""
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = [line async for line in response.aiter_lines() if line]
        return response.status_code, dict(response.headers), lines


def sse_data(lines: list[str]) -> list[str]:
    return [line[len("data: "):] for line in lines if line.startswith("data: ")]


def finish_reason(data: list[str]) -> str | None:
    chunks = [json.loads(d) for d in data if d != "[DONE]"]
    return next((c["choices"][0]["finish_reason"] for c in chunks
                 if c.get("choices") and c["choices"][0].get("finish_reason")), None)


def test_excess_requests_get_503_with_retry_after_before_headers_and_the_rest_complete(busy_stack):
    async def burst() -> list[tuple[int, dict[str, str], list[str]]]:
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=busy_stack.base_url, timeout=300, limits=limits,
                                     trust_env=False) as client:
            bodies = [chat(busy_stack, 4, stream=i % 2 == 0) for i in range(300)]
            return await asyncio.gather(*(one_request(client, body) for body in bodies))

    results = asyncio.run(burst())
    refused = [(i, r) for i, r in enumerate(results) if r[0] == 503]
    served = [(i, r) for i, r in enumerate(results) if r[0] == 200]
    assert len(refused) + len(served) == 300, sorted({r[0] for r in results})
    assert refused and len(served) >= MAX_WAITING
    for i, (status, headers, lines) in refused:
        assert headers["retry-after"] == "1" and headers["content-type"] == "application/json"
        assert "--max-waiting-requests 32" in json.loads(lines[0])["error"]["message"]
    for i, (status, headers, lines) in served:
        if i % 2 == 0:  # a stream: complete, finish reason then [DONE]
            data = sse_data(lines)
            assert data[-1] == "[DONE]" and finish_reason(data) in ("stop", "length"), data[-3:]
        else:
            assert json.loads("".join(lines))["choices"][0]["finish_reason"] in ("stop", "length")

    def state():
        return scheduler_state(busy_stack.scheduler_address)

    assert wait_for(lambda: is_idle(state()), 30), describe_usage(state())
    metrics = httpx.get(f"{busy_stack.base_url}/metrics", trust_env=False).text
    assert (f'dsv4serve:requests_rejected_total{{model_name="{busy_stack.served_model_name}",'
            f'reason="queue_full"}} {float(len(refused))}') in metrics


def test_sigterm_lets_streams_finish_or_ends_them_with_an_error_event_then_the_launcher_restarts(
        busy_stack):
    short = [chat(busy_stack, 12, stream=True) for _ in range(4)]
    # ignore_eos and ~2000 tokens: cannot finish within the grace period on any CPU.
    long = [chat(busy_stack, 2000, stream=True, ignore_eos=True) for _ in range(4)]
    frontend_pid = busy_stack.pids()["frontend"]

    async def streams_and_sigterm() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=busy_stack.base_url, timeout=120, trust_env=False) as client:
            started = [asyncio.Event() for _ in range(8)]

            async def read(body: dict, ready: asyncio.Event) -> list[str]:
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    assert response.status_code == 200
                    data = []
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            data.append(line[len("data: "):])
                            ready.set()
                    return data

            tasks = [asyncio.create_task(read(b, e)) for b, e in zip(short + long, started)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
            os.kill(frontend_pid, signal.SIGTERM)
            return await asyncio.gather(*tasks)

    outcomes = asyncio.run(streams_and_sigterm())
    for data in outcomes:
        assert data[-1] == "[DONE]", data[-3:]
        ended_by_error = "error" in json.loads(data[-2])
        assert ended_by_error or finish_reason(data) in ("stop", "length"), data[-3:]
    assert all(finish_reason(data) in ("stop", "length") for data in outcomes[:4])
    for data in outcomes[4:]:
        assert "shutting down" in json.loads(data[-2])["error"]["message"]

    assert wait_for(lambda: busy_stack.pids()["frontend"] != frontend_pid, RESTART_TIMEOUT_S)
    with httpx.Client(base_url=busy_stack.base_url, timeout=120, trust_env=False) as http:
        assert wait_for(lambda: health_status(http) == 200, RESTART_TIMEOUT_S)
        assert http.post("/v1/chat/completions", json=chat(busy_stack, 4, stream=False)).status_code == 200
    assert wait_for(lambda: is_idle(scheduler_state(busy_stack.scheduler_address)), 30)
    assert "frontend exited with status -15; restarting it" in (busy_stack.log_dir / "launcher.log").read_text()


def test_a_killed_worker_is_restarted_and_the_stack_serves_again(busy_stack):
    worker_pid = busy_stack.pids()["worker"]
    os.kill(worker_pid, signal.SIGKILL)
    assert wait_for(lambda: busy_stack.pids()["worker"] != worker_pid, RESTART_TIMEOUT_S, interval_s=0.5)
    with httpx.Client(base_url=busy_stack.base_url, timeout=120, trust_env=False) as http:
        assert wait_for(lambda: health_status(http) == 200, RESTART_TIMEOUT_S, interval_s=0.5)
        response = http.post("/v1/chat/completions", json=chat(busy_stack, 4, stream=False))
    assert response.status_code == 200, response.text
    assert "worker exited with status -9; restarting it" in (busy_stack.log_dir / "launcher.log").read_text()
