"""The default model — the trained demo — through the whole stack, with no `logit_bias`: the
operators' check passes, held-out tool calls are right with and without a grammar, a tool result is
answered in the next turn, and a call cut by max_tokens is reported as `length`."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest

from bench.bench_demo_accuracy import evaluate, load_heldout
from tests.e2e.helpers import scheduler_state

pytestmark = pytest.mark.slow

# The in-suite share of the held-out set (the bench runs all 100).
HELDOUT_IN_SUITE = 20
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city", "strict": True,
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                   "required": ["city", "days"], "additionalProperties": False}}}
SHELL_TOOL = {"type": "function", "function": {
    "name": "shell", "description": "Run a shell command", "strict": True,
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def client(demo_stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{demo_stack.base_url}/v1", api_key="unused", timeout=300,
                         max_retries=0, http_client=httpx.Client(trust_env=False, timeout=300))


def test_the_operators_check_passes_on_the_default_model(demo_stack) -> None:
    result = subprocess.run([sys.executable, "-m", "services.cli", "check", "--url", demo_stack.base_url],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASS") == 3, result.stdout


def test_held_out_calls_are_right_without_a_grammar(demo_stack) -> None:
    verdicts = evaluate(demo_stack.base_url, demo_stack.served_model_name,
                        load_heldout(HELDOUT_IN_SUITE), "auto")
    misses = [v.detail for v in verdicts if not v.right]
    assert len(misses) <= HELDOUT_IN_SUITE // 10, misses


def test_held_out_strict_calls_are_schema_valid_and_right(demo_stack) -> None:
    verdicts = evaluate(demo_stack.base_url, demo_stack.served_model_name,
                        load_heldout(HELDOUT_IN_SUITE), "strict")
    assert all(v.valid_calls == v.calls for v in verdicts), [v.detail for v in verdicts]
    misses = [v.detail for v in verdicts if not v.right]
    assert len(misses) <= HELDOUT_IN_SUITE // 20, misses


def test_the_readme_weather_request_calls_get_weather_with_the_city_and_days(demo_stack) -> None:
    body = {"model": demo_stack.served_model_name, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the weather in Paris for 3 days?"}],
            "tools": [WEATHER_TOOL]}
    with httpx.Client(base_url=demo_stack.base_url, timeout=300, trust_env=False) as http:
        choice = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}


def test_a_tool_result_is_answered_in_the_next_turn(client, demo_stack) -> None:
    """A constrained call comes back as tool_calls; sending it back with the tool result renders the
    history the model was trained on (checked through /tokenize) and gets an answer from it."""
    first_messages = [{"role": "user", "content": "Weather in Oslo for 2 days?"}]
    first = client.chat.completions.create(
        model=demo_stack.served_model_name, messages=first_messages, tools=[WEATHER_TOOL],
        tool_choice="required", max_tokens=200, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": 2}

    history = first_messages + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    second = client.chat.completions.create(model=demo_stack.served_model_name, messages=history,
                                            tools=[WEATHER_TOOL], max_tokens=40, temperature=0)
    assert second.choices[0].finish_reason == "stop"
    assert "sunny, 21C" in second.choices[0].message.content

    with httpx.Client(base_url=demo_stack.base_url, timeout=60, trust_env=False) as http:
        rendered = http.post("/tokenize", json={"model": demo_stack.served_model_name,
                                                "messages": history, "tools": [WEATHER_TOOL]})
        assert rendered.status_code == 200, rendered.text
        prompt = http.post("/detokenize", json={"model": demo_stack.served_model_name,
                                                "tokens": rendered.json()["tokens"]}).json()["prompt"]
    assert '<｜DSML｜invoke name="get_weather">' in prompt
    assert '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>' in prompt
    assert "<tool_result>sunny, 21C</tool_result>" in prompt
    assert prompt.endswith("<｜Assistant｜></think>")


def test_thinking_mode_reasons_before_the_call(client, demo_stack) -> None:
    response = client.chat.completions.create(
        model=demo_stack.served_model_name, temperature=0, max_tokens=200, tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "Weather in Madrid for 4 days?"}],
        extra_body={"chat_template_kwargs": {"thinking": True}})
    choice = response.choices[0]
    reasoning = choice.message.model_extra.get("reasoning_content")
    assert reasoning and "</think>" not in reasoning and "Madrid" in reasoning
    assert choice.finish_reason == "tool_calls"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Madrid", "days": 4}


def test_the_operators_guide_shell_request_returns_one_shell_call(demo_stack) -> None:
    body = {"model": demo_stack.served_model_name, "temperature": 0, "max_tokens": 256,
            "messages": [{"role": "user", "content": "List the files in /tmp."}],
            "tools": [SHELL_TOOL], "tool_choice": "required"}
    with httpx.Client(base_url=demo_stack.base_url, timeout=300, trust_env=False) as http:
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "shell"
        arguments = json.loads(call["function"]["arguments"])
        assert set(arguments) == {"command"} and isinstance(arguments["command"], str)

        # The same request with tool_choice "auto" and no strict tool is not constrained: the
        # scheduler compiles no grammar for it, and the model still makes the call.
        loose = {**body, "tool_choice": "auto",
                 "tools": [{"type": "function", "function": {
                     k: v for k, v in SHELL_TOOL["function"].items() if k != "strict"}}]}
        before = scheduler_state(demo_stack.scheduler_address).grammar_cache_entries
        response = http.post("/v1/chat/completions", json=loose)
        assert response.status_code == 200, response.text
        assert scheduler_state(demo_stack.scheduler_address).grammar_cache_entries == before
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice


def test_a_call_cut_by_max_tokens_reports_length_and_no_call(client, demo_stack) -> None:
    for stream in (False, True):
        kwargs = dict(model=demo_stack.served_model_name, temperature=0, max_tokens=12,
                      tools=[WEATHER_TOOL], tool_choice="required",
                      messages=[{"role": "user", "content": "Weather in Rome for 5 days?"}])
        if not stream:
            choice = client.chat.completions.create(**kwargs).choices[0]
            assert choice.finish_reason == "length" and not choice.message.tool_calls, choice
            continue
        finish = None
        for chunk in client.chat.completions.create(**kwargs, stream=True):
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
        assert finish == "length"
