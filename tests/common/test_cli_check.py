"""`dsv4serve check`: the post-upgrade check passes only for a healthy stack that really constrains."""
from __future__ import annotations

import io
import json
from typing import Any, Callable

import httpx

from services import cli

MODEL = "dsv4-flash"


def chat_response(message: dict[str, Any], finish_reason: str) -> httpx.Response:
    return httpx.Response(200, json={"object": "chat.completion", "model": MODEL, "choices": [
        {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}]})


def tool_call(arguments: str, name: str = "shell") -> dict[str, Any]:
    return {"content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}]}


def fake_frontend(health: int = 200, constrained: Callable[[], httpx.Response] | None = None,
                  seen: list[dict] | None = None) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(health, json={"status": "ok" if health == 200 else "not ready"})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        body = json.loads(request.content)
        if seen is not None:
            seen.append(body)
        if "tools" in body:
            return constrained() if constrained else chat_response(tool_call('{"command": "pwd"}'), "tool_calls")
        return chat_response({"content": "Hello!"}, "stop")

    return httpx.Client(base_url="http://frontend", transport=httpx.MockTransport(handle))


def run(client: httpx.Client, model: str | None = None) -> tuple[list[bool], str]:
    out = io.StringIO()
    results = cli.run_checks(client, model, 256, out)
    return [r.passed for r in results], out.getvalue()


def test_healthy_stack_passes_all_three_checks() -> None:
    passed, printed = run(fake_frontend())
    assert passed == [True, True, True]
    assert [line.split()[0] for line in printed.splitlines()] == ["PASS", "PASS", "PASS"]


def test_requests_ask_for_a_required_strict_tool_with_the_served_model() -> None:
    seen: list[dict] = []
    run(fake_frontend(seen=seen))
    constrained, ordinary = seen
    assert constrained["model"] == MODEL and constrained["tool_choice"] == "required"
    assert constrained["tools"][0]["function"]["strict"] is True
    assert constrained["temperature"] == 0
    assert "tools" not in ordinary and ordinary["model"] == MODEL


def test_unhealthy_stack_fails_health() -> None:
    passed, printed = run(fake_frontend(health=503))
    assert passed[0] is False and printed.startswith("FAIL health: GET /health → 503")


def test_length_truncated_tool_call_is_not_a_success() -> None:
    passed, _ = run(fake_frontend(constrained=lambda: chat_response(tool_call('{"command": "p'), "length")))
    assert passed == [True, False, True]


def test_extra_argument_keys_fail_the_constrained_check() -> None:
    arguments = '{"command": "pwd", "cwd": "/"}'
    passed, _ = run(fake_frontend(constrained=lambda: chat_response(tool_call(arguments), "tool_calls")))
    assert passed[1] is False


def test_a_rejected_constrained_request_fails_with_the_error_shown() -> None:
    error = {"error": {"message": "xgrammar is not installed", "type": "invalid_request_error"}}
    passed, printed = run(fake_frontend(constrained=lambda: httpx.Response(400, json=error)))
    assert passed[1] is False and "HTTP 400" in printed and "xgrammar is not installed" in printed


def test_unreachable_frontend_fails_every_check_and_exits_non_zero() -> None:
    out = io.StringIO()
    assert cli.run_check(["--url", "http://127.0.0.1:1", "--timeout", "1"], out) == 1
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["FAIL", "FAIL", "FAIL"]
