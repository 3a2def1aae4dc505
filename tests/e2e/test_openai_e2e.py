"""The real `openai` client against the real stack (frontend → scheduler → worker → model)."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.e2e.helpers import steering_bias

pytestmark = pytest.mark.slow

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture()
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", timeout=300, max_retries=0,
                         http_client=httpx.Client(trust_env=False, timeout=300))


def _messages(text: str) -> list[dict]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


def _stream_text(client: openai.OpenAI, model: str, messages: list[dict], max_tokens: int) -> tuple[str, str]:
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True)
    parts, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(parts), finish


def test_stream_and_non_stream_give_the_same_greedy_text(client, stack) -> None:
    messages = _messages("Name three colours.")
    whole = client.chat.completions.create(model=stack.served_model_name, messages=messages,
                                           max_tokens=12, temperature=0)
    streamed, finish = _stream_text(client, stack.served_model_name, messages, 12)
    assert whole.choices[0].message.content == streamed
    assert whole.choices[0].finish_reason == finish == "length"
    assert whole.usage.completion_tokens == 12


def test_concurrent_requests_match_the_same_requests_run_alone(stack) -> None:
    """Continuous batching of 16 requests of different lengths never changes greedy output."""
    prompts = [[1000 + 37 * i + j for j in range(3 + 11 * i)] for i in range(16)]

    def complete(prompt: list[int]) -> list[str]:
        body = {"model": stack.served_model_name, "prompt": prompt, "max_tokens": 6, "temperature": 0}
        with httpx.Client(base_url=stack.base_url, timeout=300, trust_env=False) as http:
            response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    alone = [complete(prompt) for prompt in prompts]
    with ThreadPoolExecutor(max_workers=16) as pool:
        together = list(pool.map(complete, prompts))
    assert together == alone


def test_streaming_with_include_usage_ends_with_a_usage_chunk(client, stack) -> None:
    stream = client.chat.completions.create(model=stack.served_model_name, messages=_messages("Hi"),
                                            max_tokens=5, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + 5


def test_thinking_mode_returns_reasoning_content_without_think_tags(client, stack) -> None:
    response = client.chat.completions.create(
        model=stack.served_model_name, messages=_messages("Think about 2+2."), max_tokens=8, temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": True}})
    message = response.choices[0].message
    reasoning = message.model_extra.get("reasoning_content")
    # The random model never closes its reasoning, so all 8 tokens are reasoning and nothing is content.
    assert reasoning, response
    assert not message.content
    assert "<think>" not in reasoning and "</think>" not in reasoning
    assert response.choices[0].finish_reason == "length"


def test_multi_turn_tool_conversation_round_trips(client, stack) -> None:
    """A constrained call comes back as tool_calls; sending it back with the tool result renders the
    history the model was trained on (checked through /tokenize) and gets an answer."""
    first_messages = _messages("Weather in Paris for 2 days?")
    first = client.chat.completions.create(
        model=stack.served_model_name, messages=first_messages, tools=[WEATHER_TOOL], tool_choice="required",
        max_tokens=200, temperature=0, logit_bias=steering_bias(stack.model_dir))
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert isinstance(arguments["city"], str) and isinstance(arguments["days"], int) and arguments["days"] >= 1

    history = first_messages + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"},
    ]
    second = client.chat.completions.create(model=stack.served_model_name, messages=history,
                                            tools=[WEATHER_TOOL], max_tokens=4, temperature=0)
    assert second.choices[0].finish_reason in {"length", "stop"}

    with httpx.Client(base_url=stack.base_url, timeout=60, trust_env=False) as http:
        rendered = http.post("/tokenize", json={"model": stack.served_model_name, "messages": history,
                                                "tools": [WEATHER_TOOL]})
        assert rendered.status_code == 200, rendered.text
        prompt = http.post("/detokenize", json={"model": stack.served_model_name,
                                                "tokens": rendered.json()["tokens"]}).json()["prompt"]
    assert '<｜DSML｜invoke name="get_weather">' in prompt
    assert f'<｜DSML｜parameter name="city" string="true">{arguments["city"]}</｜DSML｜parameter>' in prompt
    assert "<tool_result>sunny, 21C</tool_result>" in prompt
    assert prompt.endswith("<｜Assistant｜></think>")
