"""The work one request may cause is bounded before anything is admitted: each overflow is a 4xx
whose message names the limit and whose `param` names the field, the hostile inputs of issue 8 that
used to be 500s included, and the gateway keeps serving afterwards.

The gateway runs against the fake scheduler; the same cases against the real stack are in
tests/e2e/test_hostile_input_e2e.py.
"""
from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx
import pytest

from services.common.config import RequestBounds, SchemaBounds
from tests.frontend.fake_scheduler import MAX_MODEL_LEN, SERVED_MODEL, GatewayHarness

USER = [{"role": "user", "content": "hi"}]
INJECTION_CASES_DEPTH = 100_000


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED_MODEL, "messages": USER, **fields}


def strict_tool(parameters: dict[str, Any], name: str = "f") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "strict": True, "parameters": parameters}}


def required_call(parameters: dict[str, Any]) -> dict[str, Any]:
    return chat(tools=[strict_tool(parameters)], tool_choice="required")


def nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def optional_integers(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(count)}}


def assert_rejected(response: httpx.Response, status: int, param: Optional[str],
                    *fragments: str) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param, error
    for fragment in fragments:
        assert fragment in error["message"], error["message"]
    assert len(response.content) < 2000
    return error


def post_raw(http: httpx.Client, path: str, raw: bytes) -> httpx.Response:
    return http.post(path, content=raw, headers={"content-type": "application/json"})


class TestIssueEightFiveHundreds:
    """The inputs that got HTTP 500 in the hostile-input run are 400s naming the field."""

    def test_lone_surrogate_in_content(self, http, fake):
        raw = b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'
        assert_rejected(post_raw(http, "/v1/chat/completions", raw), 400,
                        "messages[0].content", "surrogate")
        assert fake.requests == []

    def test_lone_surrogate_in_tokenize_prompt(self, http):
        assert_rejected(post_raw(http, "/tokenize", b'{"prompt": "\\udfff"}'), 400, "prompt",
                        "surrogate")

    def test_json_nested_a_hundred_thousand_deep(self, http):
        raw = b'{"messages": ' + b"[" * INJECTION_CASES_DEPTH + b"]" * INJECTION_CASES_DEPTH + b"}"
        assert_rejected(post_raw(http, "/v1/chat/completions", raw), 400, None,
                        f"{INJECTION_CASES_DEPTH + 1} levels", "limit is 128")

    def test_tool_schema_nested_two_thousand_deep(self, http, fake):
        depth = 2000    # too deep for json.dumps too: the body is spelled out
        schema = '{"type": "object", "properties": {"x": ' * depth + '{"type": "integer"}' \
            + "}}" * depth
        body = json.dumps(required_call({})).replace('"parameters": {}', f'"parameters": {schema}')
        assert_rejected(post_raw(http, "/v1/chat/completions", body.encode()), 400, None,
                        "limit is 128")
        assert fake.requests == []

    @pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
    def test_max_tokens_of_two_to_the_thirty_two(self, http, field):
        assert_rejected(http.post("/v1/chat/completions", json=chat(**{field: 2**32})), 400, field,
                        "2147483647")

    def test_logit_bias_key_of_five_thousand_digits(self, http):
        key = "7" * 5000
        error = assert_rejected(http.post("/v1/chat/completions", json=chat(logit_bias={key: 1})),
                                400, f"logit_bias.{key[:40]}…")
        assert key[:200] not in error["message"]

    def test_non_json_numbers_are_refused(self, http):
        for raw in (b'{"messages": [], "temperature": NaN}', b'{"temperature": 1e999}',
                    b'{"seed": 1' + b"0" * 5000 + b"}"):
            assert_rejected(post_raw(http, "/v1/chat/completions", raw), 400, None, "not valid JSON")

    def test_gateway_still_answers_afterwards(self, http):
        assert http.post("/v1/chat/completions", json=chat(max_tokens=4)).status_code == 200


class TestSchemaBounds:
    def test_five_thousand_optional_properties_are_refused_before_any_grammar(self, http, fake):
        response = http.post("/v1/chat/completions", json=required_call(optional_integers(5000)))
        assert_rejected(response, 400, "tools[0].function.parameters.properties",
                        "more than 1024 properties", "limit 1024")
        assert fake.requests == []

    def test_a_thousand_optional_properties_are_served(self, http, fake):
        response = http.post("/v1/chat/completions", json=required_call(optional_integers(1000)))
        assert response.status_code == 200, response.text[:300]
        assert fake.requests[-1].constraint.spec

    def test_schema_nesting(self, http):
        response = http.post("/v1/chat/completions", json=required_call(nested_schema(40)))
        assert_rejected(response, 400, "tools[0].function.parameters" + ".properties.x" * 32,
                        "deeper than 32 levels (limit 32)")

    def test_enum_values_count_over_the_whole_request(self, http):
        params = {"type": "object", "properties": {
            f"e{i}": {"type": "string", "enum": [f"v{j}" for j in range(1500)]} for i in range(3)}}
        assert_rejected(http.post("/v1/chat/completions", json=required_call(params)), 400,
                        "tools[0].function.parameters.properties.e2.enum", "limit 4096")

    def test_length_keywords(self, http):
        params = {"type": "object", "properties": {"s": {"type": "string", "minLength": 100_000}}}
        assert_rejected(http.post("/v1/chat/completions", json=required_call(params)), 400,
                        "tools[0].function.parameters.properties.s.minLength",
                        "limit of 32768")

    def test_too_many_tools(self, http):
        tools = [strict_tool({"type": "object"}, name=f"t{i}") for i in range(129)]
        assert_rejected(http.post("/v1/chat/completions", json=chat(tools=tools)), 400, "tools",
                        "limit is 128")

    def test_unconstrained_tools_are_not_counted(self, http):
        loose = {"type": "function", "function": {"name": "loose",
                                                  "parameters": optional_integers(5000)}}
        body = chat(tools=[loose], max_tokens=4)
        assert http.post("/v1/chat/completions", json=body).status_code == 200


class TestPromptBounds:
    def test_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing(self, http, fake):
        text = "x" * (MAX_MODEL_LEN * 128 + 1)
        for path, body, param in (("/v1/chat/completions",
                                   chat(messages=[{"role": "user", "content": text}]), "messages"),
                                  ("/v1/completions", {"prompt": text}, "prompt"),
                                  ("/tokenize", {"prompt": text}, "prompt")):
            assert_rejected(http.post(path, json=body), 400, param, f"max_model_len ({MAX_MODEL_LEN})")
        assert fake.requests == []

    def test_token_id_prompt_longer_than_max_model_len(self, http):
        body = {"prompt": [5] * (MAX_MODEL_LEN + 1)}
        assert_rejected(http.post("/v1/completions", json=body), 400, "prompt", "max_model_len")

    def test_history_arguments_nested_too_deep(self, http):
        arguments = "[" * 200 + "]" * 200
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        messages = [{"role": "user", "content": "q"},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": "r"}]
        assert_rejected(http.post("/tokenize", json={"messages": messages}), 400,
                        "messages[1].tool_calls[0].function.arguments", "limit is 128")


@pytest.fixture(scope="module")
def small_body_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    bounds = RequestBounds(max_request_body_bytes=64 << 10, schema=SchemaBounds(max_grammar_bytes=4096))
    harness = GatewayHarness(Path(tmp_path_factory.mktemp("small")) / "model", bounds=bounds)
    with httpx.Client(base_url=harness.base_url, timeout=30) as client:
        yield client
    harness.close()


class TestBodySize:
    def test_declared_length_over_the_limit_is_a_413(self, small_body_http):
        body = json.dumps(chat(messages=[{"role": "user", "content": "x" * (70 << 10)}]))
        assert_rejected(small_body_http.post("/v1/chat/completions", content=body), 413, None,
                        "limit of 65536 bytes")

    def test_streamed_body_without_a_length_is_refused_past_the_limit(self, small_body_http):
        def chunks() -> Iterator[bytes]:
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"x" * (16 << 10)
            yield b'"}]}'

        response = small_body_http.post("/v1/chat/completions", content=chunks())
        assert_rejected(response, 413, None, "65536")

    def test_bodies_under_the_limit_are_served(self, small_body_http):
        body = chat(messages=[{"role": "user", "content": "x" * (32 << 10)}], max_tokens=2)
        assert small_body_http.post("/v1/chat/completions", json=body).status_code == 200

    def test_grammar_size_bound(self, small_body_http):
        response = small_body_http.post("/v1/chat/completions",
                                        json=required_call(optional_integers(40)))
        assert_rejected(response, 400, "tools", "over the server's limit of 4096")


def test_client_leaving_mid_body_is_not_an_internal_error(harness, http, caplog):
    host, port = harness.base_url.removeprefix("http://").split(":")
    with caplog.at_level(logging.ERROR, logger="services.frontend.app"):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"mess")
        # The server handles the closed socket on its own loop; a later request on a fresh
        # connection is served after it (one event loop, first come first served).
        time.sleep(0.5)
        assert http.get("/v1/models").status_code == 200
    assert "internal error" not in caplog.text
