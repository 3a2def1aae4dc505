"""The real `openai` client against the real stack (frontend → scheduler → worker → model)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow


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
