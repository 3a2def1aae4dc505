"""Speculative decoding through the real services: a stack with MTP speculation (K=3) gives the
tokens of the target-only session stack for every kind of request, and counts its drafts; so do
a DSpark K=7 stack on one rank and one on dp2 × tp2 × ep4 (ranks drafting in lockstep).

The session stack (K=0) is the reference. Cases are combined into a few
concurrent batches: plain chat, thinking, constrained `required` / named / `auto`+strict tools
(streamed and not), `response_format`, stop strings, a `max_tokens` cut inside a draft window,
prompts longer than one chunk (64-token chunks here), EOS steered into the drafts by `logit_bias`
— 24 requests, 16 at a time — and an abort storm of 200 constrained requests.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import RunningStack, launch_stack
from tests.e2e.helpers import describe_usage, is_idle, scheduler_state, steering_bias, wait_for
from tests.e2e.scheduler_calls import Call, cancelled_streams, random_prompt

pytestmark = pytest.mark.slow

K = 3
CITY_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city", "days"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Local time of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
LONG_TEXT = " ".join(f"word{i}" for i in range(120))  # > 64 tokens: several prefill chunks
PREFIX_TEXT = " ".join(f"line{i}" for i in range(160))  # > 128 + a block: a prefix hit is left


@pytest.fixture(scope="module")
def speculative(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    flags = ("--speculative-config", f'{{"method":"mtp","num_speculative_tokens":{K}}}',
             "--long-prefill-token-threshold", "64")
    yield from launch_stack(tiny_model_dir, tmp_path_factory.mktemp("spec"), request, flags)


DSPARK_K7 = ("--speculative-config", '{"method":"dspark","num_speculative_tokens":7}')


@pytest.fixture(scope="module")
def tiny_dspark_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-dspark, whose target is tiny-a byte for byte (its draft is random)."""
    from services.worker.model.tiny_checkpoint import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-dspark"), "tiny-dspark", seed=1)


@pytest.fixture(scope="module")
def dspark_stack(tiny_dspark_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                 request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    """DSpark K=7 on tiny-dspark, one rank."""
    yield from launch_stack(tiny_dspark_dir, tmp_path_factory.mktemp("dspark"), request, DSPARK_K7)


@pytest.fixture(scope="module")
def sharded_dspark_stack(tiny_dspark_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                         request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    """DSpark K=7 on tiny-dspark over dp2 × tp2 attention and ep4 experts: four ranks draft in
    lockstep (TP gathers and EP exchanges inside the draft stages)."""
    flags = ("--dp", "2", "--tp", "2", "--ep", "4", *DSPARK_K7)
    yield from launch_stack(tiny_dspark_dir, tmp_path_factory.mktemp("sharded-dspark"), request,
                            flags)


def client_of(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", timeout=300,
                         max_retries=0, http_client=httpx.Client(trust_env=False, timeout=300))


def bodies(model: str, bias: dict[str, int]) -> list[dict[str, Any]]:
    def chat(content: str, **extra: Any) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": content}],
                "temperature": 0, "max_tokens": 24, **extra}
    thinking = {"extra_body": {"chat_template_kwargs": {"thinking": True}}}
    strict = [{**t, "function": {**t["function"], "strict": True}} for t in (CITY_TOOL, TIME_TOOL)]
    tools = {"tools": [CITY_TOOL, TIME_TOOL], "logit_bias": bias, "max_tokens": 60}
    return [
        chat("Hello there"), chat("Tell me a story", **thinking),
        chat(LONG_TEXT), chat("Count", max_tokens=5), chat("Count", max_tokens=7),
        chat("Stop please", stop=["a", "e"]),
        chat("Weather?", tool_choice="required", **tools),
        chat("Weather?", tool_choice={"type": "function", "function": {"name": "get_time"}},
             **tools),
        chat("Weather?", tool_choice="required", **tools, **thinking),
        chat("Weather?", **{**tools, "tools": strict}, tool_choice="auto"),
        chat("JSON please", response_format={"type": "json_object"}, logit_bias=bias,
             max_tokens=40),
        chat("Finish", logit_bias={"1": 3}, max_tokens=30),  # EOS (id 1) steered into the drafts
    ]


def run(client: openai.OpenAI, body: dict[str, Any], stream: bool) -> tuple:
    if not stream:
        choice = client.chat.completions.create(**body).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return (choice.finish_reason, choice.message.content, calls,
                getattr(choice.message, "reasoning_content", None))
    text, reasoning, finish, arguments = "", "", None, {}
    for chunk in client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            for delta in choice.delta.tool_calls or []:
                name, args = arguments.get(delta.index, ("", ""))
                arguments[delta.index] = (name + (delta.function.name or ""),
                                          args + (delta.function.arguments or ""))
            finish = choice.finish_reason or finish
    return finish, text, [arguments[i] for i in sorted(arguments)], reasoning or None


def outcomes(stack: RunningStack, cases: list[tuple[dict[str, Any], bool]]) -> list[tuple]:
    client = client_of(stack)
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda case: run(client, *case), cases))


def metric(stack: RunningStack, name: str) -> float:
    text = httpx.get(f"{stack.base_url}/metrics", trust_env=False, timeout=30).text
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == name)


def test_speculative_stack_gives_the_target_only_tokens(stack, speculative, tiny_model_dir):
    cases = [(body, stream) for body in bodies(stack.served_model_name,
                                               steering_bias(tiny_model_dir))
             for stream in (False, True)]
    reference = outcomes(stack, cases)
    assert outcomes(speculative, cases) == reference
    assert any(r[2] for r in reference), "some constrained case must end in a tool call"
    drafted = metric(speculative, "dsv4serve:spec_decode_num_draft_tokens_total")
    assert drafted > 0
    assert metric(speculative, "dsv4serve:spec_decode_num_draft_tokens_per_pos_total") == drafted
    assert wait_for(lambda: is_idle(scheduler_state(speculative.scheduler_address)), 60)
    assert scheduler_state(speculative.scheduler_address).num_live_draft_states == 0


def test_dspark_stack_gives_the_target_only_tokens(stack, dspark_stack, tiny_model_dir):
    chosen = bodies(stack.served_model_name, steering_bias(tiny_model_dir))
    cases = [(body, stream) for body, stream in zip(chosen[:7], (False, True) * 4)]
    assert outcomes(dspark_stack, cases) == outcomes(stack, cases)
    assert metric(dspark_stack, "dsv4serve:spec_decode_num_draft_tokens_total") > 0
    assert wait_for(lambda: is_idle(scheduler_state(dspark_stack.scheduler_address)), 60)
    assert scheduler_state(dspark_stack.scheduler_address).num_live_draft_states == 0


def test_a_sharded_dspark_stack_gives_the_target_only_tokens_and_survives_a_prefix_hit(
        stack, sharded_dspark_stack, tiny_model_dir):
    """Plain chat and constrained tool calls, streamed and not, on both partitions at once; then
    a long prompt again, served from the prefix cache (DSpark leaves 128 tokens to compute, so
    the drafter's context is rebuilt from them)."""
    chosen = bodies(stack.served_model_name, steering_bias(tiny_model_dir))
    prefix = {"model": stack.served_model_name, "temperature": 0, "max_tokens": 16,
              "messages": [{"role": "user", "content": PREFIX_TEXT}]}
    cases = [(chosen[0], False), (chosen[0], True), (chosen[6], False), (chosen[6], True),
             (chosen[9], True), (prefix, False)]
    reference = outcomes(stack, cases)
    assert outcomes(sharded_dspark_stack, cases) == reference
    address = sharded_dspark_stack.scheduler_address
    hits_before = scheduler_state(address).prefix_cache_hits_total
    assert outcomes(sharded_dspark_stack, [(prefix, True)]) == outcomes(stack, [(prefix, True)])
    assert scheduler_state(address).prefix_cache_hits_total > hits_before
    assert metric(sharded_dspark_stack, "dsv4serve:spec_decode_num_draft_tokens_total") > 0
    assert wait_for(lambda: is_idle(scheduler_state(address)), 60)
    assert scheduler_state(address).num_live_draft_states == 0


def test_abort_storm_of_speculative_constrained_requests_leaves_nothing(speculative):
    """200 constrained requests cancelled at random points (before admission, mid-grammar,
    mid-window): no matcher, no draft state, every block free or evictable."""
    calls = [Call(f"spec-storm-{i}", random_prompt(90_000 + i, 12), 60, constrained=True)
             for i in range(200)]
    asyncio.run(cancelled_streams(speculative.scheduler_address, calls, seed=11))
    state = wait_for(lambda: (s := scheduler_state(speculative.scheduler_address)) and is_idle(s)
                     and s, 60)
    assert state, describe_usage(scheduler_state(speculative.scheduler_address))
    assert state.num_live_matchers == 0 and state.num_live_draft_states == 0
