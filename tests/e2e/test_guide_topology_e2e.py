"""The operators' guide's command line, as `dsv4serve stack` starts it: dp4 × tp4 attention and ep16
experts in 16 rank processes of one worker, block size 32, the guide's lengths and budgets, on CPU
with the default model (the trained demo: 4 heads and 16 experts split 16 ways); an ordinary and a
constrained `tool_choice: "required"` request, which the demo closes with no `logit_bias`."""
from __future__ import annotations

import json
from typing import Iterator

import httpx
import pytest

from services.demo.export import default_demo_model_dir
from tests.e2e.conftest import RunningStack, launch_stack
from tests.e2e.helpers import is_idle, scheduler_state, wait_for

pytestmark = pytest.mark.slow

GUIDE_FLAGS = ("--backend", "cpu", "--dp", "4", "--tp", "4", "--ep", "16", "--block-size", "32",
               "--max-model-len", "16384", "--max-num-seqs", "8",
               "--max-num-batched-tokens", "8192", "--long-prefill-token-threshold", "128",
               "--kv-cache-memory", "64MiB")
SHELL = {"type": "function", "function": {
    "name": "shell", "description": "Run a shell command", "strict": True,
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def guide_stack(tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    yield from launch_stack(default_demo_model_dir(), tmp_path_factory.mktemp("guide-stack"),
                            request, GUIDE_FLAGS)


def test_the_guide_command_line_serves_chat_and_a_constrained_tool_call(guide_stack):
    with httpx.Client(base_url=guide_stack.base_url, timeout=300, trust_env=False) as http:
        chat = http.post("/v1/chat/completions", json={
            "model": guide_stack.served_model_name, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hello!"}]})
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] > 0
        call = http.post("/v1/chat/completions", json={
            "model": guide_stack.served_model_name, "max_tokens": 256, "tools": [SHELL],
            "tool_choice": "required",
            "messages": [{"role": "user", "content": "List the files in /tmp."}]})
        assert call.status_code == 200, call.text
        choice = call.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (tool_call,) = choice["message"]["tool_calls"]
        assert set(json.loads(tool_call["function"]["arguments"])) == {"command"}
    state = scheduler_state(guide_stack.scheduler_address)
    assert len(state.partitions) == 4
    assert wait_for(lambda: is_idle(scheduler_state(guide_stack.scheduler_address)), 30)
