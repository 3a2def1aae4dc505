"""The default model — the trained demo — through the whole stack, with no `logit_bias`: the
operators' check passes, the trained chat answers come back, a strict call is schema-valid and
closed by the model, a tool result is answered in the next turn, thinking mode reasons before its
call, a word training never used is read as its trained spelling, and a call cut by max_tokens
is reported as `length`. Held-out accuracy is a figure of
`bench/bench_demo_accuracy.py`, not asserted here."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city", "strict": True,
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                   "required": ["city", "days"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def client(demo_stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{demo_stack.base_url}/v1", api_key="unused", timeout=300,
                         max_retries=0, http_client=httpx.Client(trust_env=False, timeout=300))


def test_the_operators_check_passes_on_the_default_model(demo_stack) -> None:
    result = subprocess.run([sys.executable, "-m", "services.cli", "check", "--url", demo_stack.base_url],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASS") == 3, result.stdout


def test_the_trained_chat_answers_come_back(demo_stack) -> None:
    """A random-weight model cannot say this: the stack serves the trained weights."""
    body = {"model": demo_stack.served_model_name, "temperature": 0, "max_tokens": 64,
            "messages": [{"role": "user", "content": "Who are you?"}]}
    with httpx.Client(base_url=demo_stack.base_url, timeout=300, trust_env=False) as http:
        choice = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    assert choice["message"]["content"] == "I am a tiny DeepSeek-V4 demo model served by dsv4serve."


def test_a_tool_result_is_answered_in_the_next_turn(client, demo_stack) -> None:
    """A constrained call comes back as tool_calls with the city and days copied from the request;
    sending it back with the tool result renders the history the model was trained on (checked
    through /tokenize) and gets an answer from the result that names the city. (Tokyo: a real city
    the demo copies; Oslo and Madrid it does not, see docs/demo-model.md.)"""
    first_messages = [{"role": "user", "content": "Weather in Tokyo for 2 days?"}]
    first = client.chat.completions.create(
        model=demo_stack.served_model_name, messages=first_messages, tools=[WEATHER_TOOL],
        tool_choice="required", max_tokens=200, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    assert arguments == {"city": "Tokyo", "days": 2}

    history = first_messages + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    second = client.chat.completions.create(model=demo_stack.served_model_name, messages=history,
                                            tools=[WEATHER_TOOL], max_tokens=40, temperature=0)
    answer = second.choices[0].message.content
    assert second.choices[0].finish_reason == "stop" and "21C" in answer and "Tokyo" in answer, answer

    with httpx.Client(base_url=demo_stack.base_url, timeout=60, trust_env=False) as http:
        rendered = http.post("/tokenize", json={"model": demo_stack.served_model_name,
                                                "messages": history, "tools": [WEATHER_TOOL]})
        assert rendered.status_code == 200, rendered.text
        prompt = http.post("/detokenize", json={"model": demo_stack.served_model_name,
                                                "tokens": rendered.json()["tokens"]}).json()["prompt"]
    assert '<｜DSML｜invoke name="get_weather">' in prompt
    city = arguments["city"]
    assert f'<｜DSML｜parameter name="city" string="true">{city}</｜DSML｜parameter>' in prompt
    assert "<tool_result>sunny, 21C</tool_result>" in prompt
    assert prompt.endswith("<｜Assistant｜></think>")


LIST_FILES_TOOL = {"type": "function", "function": {
    "name": "list_files", "description": "List files",
    "parameters": {"type": "object",
                   "properties": {"path": {"type": "string"}, "hidden": {"type": "boolean"}},
                   "required": ["path"], "additionalProperties": False}}}


@pytest.mark.parametrize("request_text, path", [
    ("Show the directory ./docs but skip hidden files.", "./docs"),
    ("List the files in ~/archive but skip hidden files.", "~/archive")])
def test_a_word_training_never_used_is_read_as_its_trained_spelling(client, demo_stack,
                                                                     request_text, path) -> None:
    """Training said "skipping hidden files", never " skip": the expanded checkpoint gives
    " skip" the row of " skipping" (services/demo/standins.py), so the request gets the call its
    trained phrasing gets. With the mean row in its place run H3 answered both with `hidden:
    true`, one with the path run on ("./src but"). (Where a path ends in this frame is the
    model's own weakness: run H3 and run I2 each get 3 of 6 "./" directories wrong in it, not
    the same three; docs/demo-model.md.)"""
    def call_for(text: str) -> tuple[str, dict]:
        response = client.chat.completions.create(
            model=demo_stack.served_model_name, temperature=0, max_tokens=120,
            tools=[LIST_FILES_TOOL], messages=[{"role": "user", "content": text}],
            extra_body={"chat_template_kwargs": {"thinking": False}})
        (call,) = response.choices[0].message.tool_calls
        return call.function.name, json.loads(call.function.arguments)

    call = call_for(request_text)
    assert call == ("list_files", {"path": path, "hidden": False})
    assert call_for(request_text.replace(" skip ", " skipping ")) == call


def test_thinking_mode_reasons_before_the_call(client, demo_stack) -> None:
    response = client.chat.completions.create(
        model=demo_stack.served_model_name, temperature=0, max_tokens=200, tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "Weather in Madrid for 4 days?"}],
        extra_body={"chat_template_kwargs": {"thinking": True}})
    choice = response.choices[0]
    reasoning = choice.message.model_extra.get("reasoning_content")
    assert reasoning and "</think>" not in reasoning
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])


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
