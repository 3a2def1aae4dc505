"""A raw-string `maxLength` through the whole stack: the scheduler enforces it (it is lifted out of
the compiled grammar), so the default model's random text is cut at the limit and the call closes."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.e2e.conftest import RunningStack

pytestmark = pytest.mark.slow

NOTE = {"type": "function", "function": {"name": "note", "strict": True, "parameters": {
    "type": "object", "additionalProperties": False, "required": ["title"],
    "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 4}}}}}


def test_raw_string_max_length_cuts_the_value_and_the_call_completes(stack: RunningStack) -> None:
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", timeout=300,
                           max_retries=0, http_client=httpx.Client(trust_env=False))
    lengths = []
    for prompt in ("Write a note.", "Title this: the weather in Paris", "note"):
        response = client.chat.completions.create(
            model=stack.served_model_name, messages=[{"role": "user", "content": prompt}],
            tools=[NOTE], tool_choice="required", parallel_tool_calls=False, max_tokens=120)
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        title = json.loads(call.function.arguments)["title"]
        assert call.function.name == "note" and 1 <= len(title) <= 4, title
        lengths.append(len(title))
    assert 4 in lengths      # random text runs to the limit: the cut is the scheduler's, not luck
