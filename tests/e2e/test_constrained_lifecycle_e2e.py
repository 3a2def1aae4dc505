"""Constrained requests leave nothing behind, and a scheduler without XGrammar refuses them cleanly
(no fallback to unconstrained decoding) while ordinary requests keep working."""
from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.e2e.helpers import (NAME, Services, describe_usage, health_status, is_idle, scheduler_state,
                               wait_for)

pytestmark = pytest.mark.slow

TOOL = {"type": "function", "function": {
    "name": "lookup", "strict": True,
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["query"], "additionalProperties": False}}}


def _constrained(model: str, stream: bool, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "look it up"}], "tools": [TOOL],
            "tool_choice": "required", "max_tokens": 24, "stream": stream, **extra}


def test_200_constrained_requests_with_random_aborts_leave_no_matcher_or_block(stack) -> None:
    rng = random.Random(7)
    plans = [(rng.random() < 0.5, rng.randint(1, 6)) for _ in range(200)]  # (abort?, after n lines)
    errors: list[str] = []

    def one(index: int) -> None:
        abort, after = plans[index]
        body = _constrained(stack.served_model_name, stream=True,
                            parallel_tool_calls=index % 2 == 0)
        with httpx.Client(base_url=stack.base_url, timeout=300, trust_env=False) as http:
            with http.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    errors.append(f"{index}: HTTP {response.status_code}")
                    return
                for seen, _ in enumerate(response.iter_lines(), start=1):
                    if abort and seen >= after:
                        return  # the client goes away mid-stream

    threads: list[threading.Thread] = []
    for start in range(0, 200, 20):  # waves of 20 concurrent clients
        wave = [threading.Thread(target=one, args=(i,)) for i in range(start, start + 20)]
        for thread in wave:
            thread.start()
        threads += wave
        for thread in wave:
            thread.join(300)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors[:5]
    idle = wait_for(lambda: is_idle(scheduler_state(stack.scheduler_address)), 10)
    state = scheduler_state(stack.scheduler_address)
    assert idle, describe_usage(state)
    assert state.num_live_matchers == 0 and state.num_grammar_pending == 0


@pytest.fixture()
def scheduler_without_xgrammar(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Services]:
    """The three services, the scheduler's `import xgrammar` failing as on a host without it."""
    shadow = tmp_path / "shadow" / "xgrammar"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("xgrammar is not installed (test shadow)")\n')
    services = Services(tiny_model_dir, tmp_path)
    services.extra_env["scheduler"] = {"PYTHONPATH": str(shadow.parent)}
    with services:
        yield services


def test_without_xgrammar_constrained_requests_are_400_and_plain_ones_work(scheduler_without_xgrammar) -> None:
    services = scheduler_without_xgrammar
    with httpx.Client(base_url=services.base_url, trust_env=False, timeout=120) as http:
        assert wait_for(lambda: health_status(http) == 200, 240, 0.5), services.logs()
        for stream in (False, True):
            response = http.post("/v1/chat/completions", json=_constrained(NAME, stream))
            assert response.status_code == 400, response.text
            assert response.headers["content-type"].startswith("application/json")
            assert "xgrammar" in response.json()["error"]["message"].lower()
        plain = http.post("/v1/chat/completions", json={
            "model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert plain.status_code == 200, plain.text
        assert plain.json()["usage"]["completion_tokens"] == 3
