"""Async scheduling through the real services: the session stack (async scheduling on, the
default) answers exactly what a stack started with --no-async-scheduling answers — plain text up
to max_tokens, a stop string, and a structural tool call — and both end idle."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import RunningStack, launch_stack
from tests.e2e.helpers import describe_usage, is_idle, scheduler_state, steering_bias, wait_for

pytestmark = pytest.mark.slow

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "days": {"type": "integer"}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def sequential_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                     request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    yield from launch_stack(tiny_model_dir, tmp_path_factory.mktemp("sequential-stack"), request,
                            extra_args=("--no-async-scheduling",))


def client_of(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", timeout=600,
                         max_retries=0, http_client=httpx.Client(trust_env=False, timeout=600))


def answer(client: openai.OpenAI, body: dict[str, Any]) -> tuple:
    choice = client.chat.completions.create(**body).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content, calls, choice.finish_reason


def answers(stack: RunningStack, bodies: list[dict[str, Any]]) -> list[tuple]:
    client = client_of(stack)
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(lambda body: answer(client, body), bodies))


def test_async_scheduling_answers_exactly_what_the_sequential_loop_answers(
        stack: RunningStack, sequential_stack: RunningStack) -> None:
    def body(content: str, **fields: Any) -> dict[str, Any]:
        return {"model": stack.served_model_name, "temperature": 0,
                "messages": [{"role": "user", "content": content}], **fields}

    plain = body("Describe the sea.", max_tokens=24)
    text, _, _ = answer(client_of(sequential_stack), plain)
    stop = text[len(text) // 2:len(text) // 2 + 3]  # a stop string the greedy text reaches
    assert stop.strip(), f"no usable stop string in {text!r}"
    bodies = [plain, body("Describe the sea.", max_tokens=24, stop=[stop]),
              body("Weather in Oslo?", max_tokens=96, tools=[TOOL], tool_choice="required",
                   logit_bias=steering_bias(stack.model_dir)),
              body("Name three rivers.", max_tokens=16)]
    sequential = answers(sequential_stack, bodies)
    overlapped = answers(stack, bodies)
    assert overlapped == sequential
    assert sequential[0][2] == "length" and sequential[1][2] == "stop"
    assert stop not in sequential[1][0] and text.startswith(sequential[1][0])
    assert sequential[2][2] == "tool_calls" and sequential[2][1][0][0] == "get_weather"
    for each in (stack, sequential_stack):
        assert wait_for(lambda: is_idle(scheduler_state(each.scheduler_address)), 10), \
            describe_usage(scheduler_state(each.scheduler_address))
        # The workers' compute is part of the step time the scheduler counted, never more.
        state = scheduler_state(each.scheduler_address)
        assert 0 < state.worker_forward_seconds_total <= state.step_seconds_total
