"""Structural tool calls through the whole stack: every call a constrained request returns has a
declared name and arguments that validate against the declared schema — by construction.

The tiny-a model has random weights, so its unconstrained output is noise and it rarely closes a
string on its own. The fuzz steers greedy decoding with the API's own `logit_bias` towards the tokens
that close values and blocks (greedy stays greedy), so that most cases end with a call; a fuzz that
only ever hits `length` would prove nothing.

A position-independent bias cannot also steer `auto` mode into its block: starting the block from free
text needs `\n\n<` to win where a raw string value needs `</` to win, and both are legal in both
places. So `auto` cases are checked for validity (text without markup, or valid calls) and the share
of calls is required of the `required` and named cases.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.helpers import describe_usage, is_idle, scheduler_state, steering_bias, wait_for

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[1] / "data" / "tool_schemas.json"
CHOICES = ("required", "named", "auto")
MAX_TOKENS = 160
COMBOS_PER_TOOL = 2
# Auto-mode cases end in free text with this steering (see the module docstring), so they only need
# enough tokens to show that free text never carries markup.
MAX_TOKENS_AUTO = 40


@dataclass(frozen=True)
class Case:
    tool_index: int
    choice: str
    thinking: bool
    stream: bool


@dataclass
class Outcome:
    finish_reason: Optional[str]
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)
    content: str = ""


def _balanced_cases(num_tools: int) -> list[Case]:
    """Every tool in COMBOS_PER_TOOL of the 12 (tool_choice × thinking × stream) combinations: tool i
    meets combination i mod 12 and the one six places on, which has another tool_choice and the other
    thinking mode, so each combination meets a sixth of the corpus and every tool is seen thinking and
    not. (The full product, 12 per tool, took 13 minutes on 2 cores, mostly cold grammar compiles.)"""
    combos = [(choice, thinking, stream) for choice in CHOICES for thinking in (False, True)
              for stream in (False, True)]
    stride = len(combos) // COMBOS_PER_TOOL
    return [Case(i, *combos[(i + stride * j) % len(combos)])
            for i in range(num_tools) for j in range(COMBOS_PER_TOOL)]


def _corpus() -> list[dict[str, Any]]:
    return json.loads(CORPUS.read_text())["tools"]


def _strict(tool: dict[str, Any]) -> dict[str, Any]:
    return {**tool, "function": {**tool["function"], "strict": True}}


def _request(case: Case, tools: list[dict[str, Any]], model: str, bias: dict[str, int],
             max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    tool = tools[case.tool_index]
    # Two tools, so "required" and "auto" have a real choice and "named" has one to refuse.
    other = tools[(case.tool_index + 1) % len(tools)]
    declared = [_strict(tool), _strict(other)] if case.choice == "auto" else [tool, other]
    tool_choice: Any = {"required": "required", "auto": "auto",
                        "named": {"type": "function", "function": {"name": tool["function"]["name"]}}}[case.choice]
    return {"model": model, "messages": [{"role": "user", "content": "Use a tool."}], "tools": declared,
            "tool_choice": tool_choice, "parallel_tool_calls": case.tool_index % 2 == 0,
            "max_tokens": max_tokens, "temperature": 0, "logit_bias": bias,
            "extra_body": {"chat_template_kwargs": {"thinking": case.thinking}}}


def _run(client: openai.OpenAI, case: Case, body: dict[str, Any]) -> Outcome:
    if not case.stream:
        choice = client.chat.completions.create(**body).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return Outcome(choice.finish_reason, calls, choice.message.content or "")
    outcome = Outcome(None)
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for chunk in client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            outcome.content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                if delta.function and delta.function.name:
                    assert delta.index not in names, "a call's name must be sent once"
                    names[delta.index] = delta.function.name
                if delta.function and delta.function.arguments:
                    arguments[delta.index] = arguments.get(delta.index, "") + delta.function.arguments
            outcome.finish_reason = choice.finish_reason or outcome.finish_reason
    if outcome.finish_reason == "tool_calls":
        outcome.calls = [(names[i], arguments.get(i, "")) for i in sorted(names)]
    return outcome


def _check(case: Case, body: dict[str, Any], outcome: Outcome) -> Optional[str]:
    """Why this outcome breaks the contract, or None."""
    declared = {tool["function"]["name"]: tool["function"].get("parameters") or {} for tool in body["tools"]}
    if "｜DSML｜" in outcome.content or "<think>" in outcome.content or "</think>" in outcome.content:
        return f"markup leaked into content: {outcome.content[:200]!r}"
    if outcome.finish_reason != "tool_calls":
        return None if not outcome.calls else f"{outcome.finish_reason} with calls {outcome.calls}"
    if not outcome.calls:
        return "finish_reason tool_calls without a call"
    if not body["parallel_tool_calls"] and len(outcome.calls) > 1:
        return f"parallel_tool_calls=false but {len(outcome.calls)} calls"
    for name, arguments in outcome.calls:
        if name not in declared:
            return f"undeclared tool {name!r}"
        if case.choice == "named" and name != body["tool_choice"]["function"]["name"]:
            return f"named tool {body['tool_choice']['function']['name']!r} but got {name!r}"
        try:
            jsonschema.validate(json.loads(arguments), declared[name],
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        except (ValueError, jsonschema.ValidationError) as error:
            return f"{name} arguments {arguments!r} invalid: {str(error).splitlines()[0]}"
    return None


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", timeout=600, max_retries=0,
                         http_client=httpx.Client(trust_env=False, timeout=600))


def test_every_constrained_call_is_declared_and_validates(stack, client) -> None:
    tools = _corpus()
    assert len(tools) >= 40
    bias = steering_bias(stack.model_dir)
    cases = _balanced_cases(len(tools))
    bodies = [_request(case, tools, stack.served_model_name, bias,
                       MAX_TOKENS_AUTO if case.choice == "auto" else MAX_TOKENS) for case in cases]
    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(lambda pair: _run(client, *pair), zip(cases, bodies)))

    problems = [f"{case}: {why}" for case, body, outcome in zip(cases, bodies, outcomes)
                if (why := _check(case, body, outcome))]
    assert not problems, "\n".join(problems[:20])
    forced = [outcome for case, outcome in zip(cases, outcomes) if case.choice != "auto"]
    with_calls = sum(outcome.finish_reason == "tool_calls" for outcome in forced)
    share = with_calls / len(forced)
    auto_calls = sum(o.finish_reason == "tool_calls" for c, o in zip(cases, outcomes) if c.choice == "auto")
    print(f"\nconstrained fuzz: {with_calls}/{len(forced)} required/named cases ended with tool_calls "
          f"({share:.0%}); auto: {auto_calls}/{len(cases) - len(forced)}")
    assert share >= 0.9, f"only {share:.0%} of the cases ended with a call; the fuzz proves too little"
    assert wait_for(lambda: is_idle(scheduler_state(stack.scheduler_address)), 10), \
        describe_usage(scheduler_state(stack.scheduler_address))


def test_an_unsupported_schema_is_a_400_before_any_header(stack, http: httpx.Client) -> None:
    tool = {"type": "function", "function": {"name": "guarded", "strict": True, "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}},
        "if": {"properties": {"x": {"minimum": 1}}}, "then": {"required": ["x"]}}}}
    for stream in (False, True):
        response = http.post("/v1/chat/completions", json={
            "model": stack.served_model_name, "messages": [{"role": "user", "content": "hi"}],
            "tools": [tool], "tool_choice": "required", "stream": stream})
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert "guarded" in message and "if" in message, message
