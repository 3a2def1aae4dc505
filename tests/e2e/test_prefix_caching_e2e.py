"""Prefix caching through the real services: the same tokens with and without cache hits, shared
system prompts, a multi-turn tool conversation, memory pressure with constrained replay, and an
abort storm.

Two stacks: `warm` caches prefixes, has 112 blocks per group (a 3,000-token prompt fits alone; 16
requests over 12 different 256-token prefixes do not fit together) and preempts constrained
requests by replay; `cold` has prefix caching off and room for everything, so its outputs are the
unpreempted, uncached reference. Block size 32.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import RunningStack, launch_stack
from tests.e2e.helpers import (describe_usage, grpcurl_path, is_idle, scheduler_state,
                               steering_bias, wait_for)
from tests.e2e.scheduler_calls import (Call, cached_blocks, cancelled_streams, generate, hits_of,
                                       random_prompt, referenced_blocks)

pytestmark = pytest.mark.slow

BLOCK = 32
COMMON = ("--max-model-len", "4096", "--max-num-batched-tokens", "4096", "--max-num-seqs", "16")
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer", "minimum": 1}},
                   "required": ["city", "days"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def warm(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
         request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    flags = (*COMMON, "--num-blocks", "112", "--preempt-constrained", "replay")
    yield from launch_stack(tiny_model_dir, tmp_path_factory.mktemp("warm"), request, flags)


@pytest.fixture(scope="module")
def cold(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
         request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    flags = (*COMMON, "--no-enable-prefix-caching")
    yield from launch_stack(tiny_model_dir, tmp_path_factory.mktemp("cold"), request, flags)


@pytest.mark.parametrize("length", [130, 256, 300, 1000, 3000])
def test_warm_runs_give_the_cold_tokens_at_every_prompt_length(warm, cold, length: int) -> None:
    prompt = random_prompt(length, length)
    aligned = (length - 1) // BLOCK * BLOCK        # the longest hit: one token left to compute
    diverged = list(prompt)
    diverged[aligned - BLOCK + 5] += 1             # inside the last aligned block
    first, first_hits = hits_of(warm.scheduler_address, Call(f"first-{length}", prompt, 6))
    second, second_hits = hits_of(warm.scheduler_address, Call(f"second-{length}", prompt, 6))
    third, third_hits = hits_of(warm.scheduler_address, Call(f"third-{length}", diverged, 6))
    assert (first_hits, second_hits, third_hits) == (0, aligned, aligned - BLOCK)
    assert first == second == generate(cold.scheduler_address, Call(f"cold-{length}", prompt, 6))
    assert third == generate(cold.scheduler_address, Call(f"cold-d-{length}", diverged, 6))


def openai_client(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", timeout=300,
                         max_retries=0, http_client=httpx.Client(trust_env=False, timeout=300))


def metric(stack: RunningStack, name: str) -> float:
    text = httpx.get(f"{stack.base_url}/metrics", trust_env=False, timeout=30).text
    return next(s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == name)


def rendered(stack: RunningStack, messages: list[dict]) -> list[int]:
    body = {"model": stack.served_model_name, "messages": messages, "tools": [WEATHER_TOOL]}
    response = httpx.post(f"{stack.base_url}/tokenize", json=body, trust_env=False, timeout=60)
    return response.json()["tokens"]


def test_two_conversations_sharing_a_system_prompt_hit_on_the_shared_part(warm, cold,
                                                                          tmp_path) -> None:
    system = {"role": "system", "content": "You answer questions about the weather. " * 75}
    conversations = [[system, {"role": "user", "content": text}]
                     for text in ("Is it raining in Oslo?", "Pack for Lima in June.")]
    a, b = (rendered(warm, messages) for messages in conversations)
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert shared >= 600, shared
    cold_client, warm_client = openai_client(cold), openai_client(warm)
    hits_before = scheduler_state(warm.scheduler_address).prefix_cache_hits_total
    for messages in conversations:
        answers = [client.chat.completions.create(
            model=stack.served_model_name, messages=messages, tools=[WEATHER_TOOL], max_tokens=8,
            temperature=0).choices[0].message.content
            for client, stack in ((cold_client, cold), (warm_client, warm))]
        assert answers[0] == answers[1]
    hits = scheduler_state(warm.scheduler_address).prefix_cache_hits_total - hits_before
    assert hits >= shared // BLOCK * BLOCK
    called = subprocess.run([grpcurl_path(), "-plaintext", warm.scheduler_address,
                             "dsv4serve.v1.Scheduler/GetSchedulerState"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    partition = json.loads(called.stdout)["partitions"][0]
    assert int(partition["prefix_cache_hits"]) >= hits and partition["prefix_cache_hit_rate"] > 0
    assert all(group["cached_blocks"] > 0 for group in partition["groups"])


def tool_conversation(stack: RunningStack, turns: int) -> list[tuple[str, int, float]]:
    """Each turn: a required tool call, appended with its result → (arguments, prompt tokens,
    prefix-cache hit tokens of the turn from /metrics)."""
    client, bias = openai_client(stack), steering_bias(stack.model_dir)
    messages = [{"role": "system", "content": "You are a weather assistant. " * 60},
                {"role": "user", "content": "Weather in Paris for 2 days?"}]
    record = []
    for turn in range(turns):
        hits_before = metric(stack, "vllm:prefix_cache_hits_total")
        response = client.chat.completions.create(
            model=stack.served_model_name, messages=messages, tools=[WEATHER_TOOL],
            tool_choice="required", max_tokens=200, temperature=0, logit_bias=bias)
        call = response.choices[0].message.tool_calls[0]
        hits = metric(stack, "vllm:prefix_cache_hits_total") - hits_before
        record.append((call.function.arguments, response.usage.prompt_tokens, hits))
        messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": f"sunny, {20 + turn}C"}]
    return record


def test_six_turn_tool_conversation_is_served_from_cache_from_turn_two(warm, cold) -> None:
    cold_turns = tool_conversation(cold, 6)
    warm_turns = tool_conversation(warm, 6)
    assert [(args, tokens) for args, tokens, _ in warm_turns] == \
        [(args, tokens) for args, tokens, _ in cold_turns]
    for turn, (_, prompt_tokens, hits) in enumerate(warm_turns[1:], start=2):
        aligned = prompt_tokens // 128 * 128
        assert hits >= 0.9 * aligned, f"turn {turn}: {hits} of {aligned} aligned tokens cached"


def test_pressure_with_shared_prefixes_fails_nothing_and_replays_constrained_requests(warm, cold):
    # Every request is constrained, so every preemption must be a replay: with a mix, which
    # request is the youngest when blocks run out is timing, and 2-3 preemptions a run left a
    # constrained victim to chance. 12 prefixes of 8 blocks among 16 running overfill the 112.
    prefixes = [random_prompt(50_000 + i, 256) for i in range(12)]
    calls = [Call(f"pressure-{i}", prefixes[i % 12] + random_prompt(60_000 + i, 5 + i % 30), 8,
                  constrained=True) for i in range(100)]
    before = scheduler_state(warm.scheduler_address)
    with ThreadPoolExecutor(16) as pool:
        expected = list(pool.map(lambda c: generate(cold.scheduler_address, c), calls))
        outputs = list(pool.map(lambda c: generate(warm.scheduler_address, c), calls))
    assert outputs == expected
    after = wait_for(lambda: (s := scheduler_state(warm.scheduler_address)) and is_idle(s) and s,
                     30)
    assert after, describe_usage(scheduler_state(warm.scheduler_address))
    assert referenced_blocks(after) == 0 and after.num_live_matchers == 0
    preempted = after.preemptions_total - before.preemptions_total
    assert preempted > 0
    assert after.constrained_preemptions_total - before.constrained_preemptions_total == preempted


def test_an_abort_storm_leaks_no_reference_and_leaves_the_cache_evictable(warm, cold) -> None:
    prefixes = [random_prompt(70_000 + i, 160) for i in range(5)]
    calls = [Call(f"storm-{i}", prefixes[i % 5] + random_prompt(80_000 + i, 3), 40,
                  constrained=i % 5 == 4) for i in range(300)]
    before = scheduler_state(warm.scheduler_address)
    asyncio.run(cancelled_streams(warm.scheduler_address, calls, seed=3))
    state = wait_for(lambda: (s := scheduler_state(warm.scheduler_address)) and is_idle(s) and s,
                     60)
    assert state, describe_usage(scheduler_state(warm.scheduler_address))
    assert referenced_blocks(state) == 0 and cached_blocks(state) > 0
    assert state.steps_total > before.steps_total  # the storm's requests did run
    survivor = Call("after-storm", prefixes[0] + [5, 6, 7], 4)
    assert generate(warm.scheduler_address, survivor) == generate(cold.scheduler_address,
                                                                  survivor)
