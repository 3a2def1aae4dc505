"""A worker that dies is visible at once, fails its in-flight requests clearly, and is picked up again
when it returns — without restarting the scheduler. The three services run as separate processes
started with their own `python -m services.<name>` commands."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.e2e.helpers import NAME, Services, health_status, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture()
def services(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Services]:
    with Services(tiny_model_dir, tmp_path) as running:
        yield running


def test_killing_the_worker_fails_in_flight_requests_and_a_restart_recovers(services: Services) -> None:
    with httpx.Client(base_url=services.base_url, trust_env=False, timeout=120) as http:
        assert wait_for(lambda: health_status(http) == 200, 240, 0.5), services.logs()

        outcome: dict[str, object] = {}
        first_token = threading.Event()

        def long_stream() -> None:
            body = {"model": NAME, "messages": [{"role": "user", "content": "go"}], "max_tokens": 1000,
                    "stream": True}
            with http.stream("POST", "/v1/chat/completions", json=body) as response:
                outcome["status"] = response.status_code
                lines = []
                for line in response.iter_lines():
                    if not line:
                        continue
                    lines.append(line)
                    if '"content"' in line:
                        first_token.set()
                outcome["lines"] = lines

        streamer = threading.Thread(target=long_stream)
        streamer.start()
        assert first_token.wait(120), services.logs()
        services.kill("worker")

        assert wait_for(lambda: health_status(http) == 503, 10, 0.2), "health did not turn 503 after the worker died"
        streamer.join(60)
        assert not streamer.is_alive(), "the in-flight stream did not end after the worker died"
        assert outcome["status"] == 200
        lines = outcome["lines"]
        errors = [line for line in lines if line.startswith("data: {\"error\"")]
        assert errors, lines[-5:]
        assert "worker" in errors[0].lower(), errors[0]
        assert lines[-1] == "data: [DONE]"

        scheduler = services.processes["scheduler"]
        services.start("worker")
        assert wait_for(lambda: health_status(http) == 200, 240, 0.5), services.logs()
        assert scheduler.poll() is None, "the scheduler must survive the worker's restart"
        response = http.post("/v1/chat/completions", json={
            "model": NAME, "messages": [{"role": "user", "content": "again"}], "max_tokens": 3})
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 3
