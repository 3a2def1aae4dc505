"""Client mistakes and scheduler refusals become OpenAI error objects with the right HTTP status.

400 for bad input (never 422/500), 404 for an unknown model, 503 when the scheduler is unavailable;
admission errors arrive as plain JSON even for `stream: true`, because no header is sent before the
scheduler admits the request. Bodies never echo large inputs back.
"""
from __future__ import annotations

import socket

import grpc
import httpx
import openai
import pytest
from starlette.testclient import TestClient

from services.common.config import FrontendConfig
from services.frontend.app import create_app
from tests.frontend.fake_scheduler import SERVED_MODEL, Script, shared_tokenizer

USER_TURN = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def chat(**fields) -> dict:
    return {"model": SERVED_MODEL, "messages": USER_TURN, **fields}


def assert_openai_error(response: httpx.Response, status: int, param: object = ...) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not ...:
        assert error["param"] == param
    return error


BAD_CHAT_BODIES = [
    ("missing messages", {"model": SERVED_MODEL}, "messages"),
    ("empty messages", chat(messages=[]), "messages"),
    ("temperature 0.7", chat(temperature=0.7), "temperature"),
    ("top_p 0.9", chat(top_p=0.9), "top_p"),
    ("top_k 40", chat(top_k=40), "top_k"),
    ("n 2", chat(n=2), "n"),
    ("logprobs", chat(logprobs=True), "logprobs"),
    ("max_tokens 0", chat(max_tokens=0), "max_tokens"),
    ("max_tokens string", chat(max_tokens="ten"), "max_tokens"),
    ("conflicting max tokens", chat(max_tokens=5, max_completion_tokens=6), "max_completion_tokens"),
    ("five stop strings", chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("stop not strings", chat(stop=[1]), "stop[0]"),
    ("logit_bias key not a token id", chat(logit_bias={"abc": 1}), "logit_bias.abc"),
    ("logit_bias out of range", chat(logit_bias={"5": 101}), "logit_bias.5"),
    ("stream_options without stream", chat(stream_options={"include_usage": True}),
     "stream_options"),
    ("response_format type", chat(response_format={"type": "yaml"}), "response_format.type"),
    ("undeclared tool in tool_choice",
     chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice.function.name"),
    ("unsupported content part",
     chat(messages=[{"role": "user", "content": [
         {"type": "text", "text": "look"},
         {"type": "image_url", "image_url": {"url": "http://x"}}]}]),
     "messages[0].content[1].type"),
]


@pytest.mark.parametrize("body,param", [(b, p) for _, b, p in BAD_CHAT_BODIES],
                         ids=[name for name, _, _ in BAD_CHAT_BODIES])
def test_bad_chat_request_is_a_400_naming_the_field(http, fake, body, param):
    assert_openai_error(http.post("/v1/chat/completions", json=body), 400, param)
    assert fake.requests == []


def test_non_greedy_sampling_explains_that_only_greedy_is_supported(http):
    error = assert_openai_error(http.post("/v1/chat/completions", json=chat(temperature=0.7)), 400)
    assert "greedy" in error["message"]


def test_malformed_json_is_a_400(http):
    response = http.post("/v1/chat/completions", content=b'{"model": ',
                         headers={"content-type": "application/json"})
    assert "not valid JSON" in assert_openai_error(response, 400)["message"]


def test_non_object_body_is_a_400(http):
    assert_openai_error(http.post("/v1/chat/completions", json=[1, 2]), 400)


def test_unknown_model_is_a_404(http, fake):
    error = assert_openai_error(http.post("/v1/chat/completions", json=chat(model="gpt-9")), 404,
                                "model")
    assert error["code"] == "model_not_found"
    assert fake.requests == []


def test_openai_client_sees_a_bad_request_error(harness):
    client = openai.OpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN, n=2)
    assert raised.value.status_code == 400


def test_error_bodies_do_not_echo_large_inputs(http):
    huge = "x" * 1_000_000
    for body in (chat(model=huge), chat(temperature=huge), chat(stop=[huge] * 5)):
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code in (400, 404)
        assert len(response.content) < 1000


def test_bad_completion_prompts_are_400s(http):
    for body, param in (({"prompt": ""}, "prompt"), ({"prompt": [1, -2]}, "prompt[1]"),
                        ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "x", "echo": True}, "echo"),
                        ({"prompt": "x", "logprobs": 2}, "logprobs")):
        assert_openai_error(http.post("/v1/completions", json=body), 400, param)


def test_prompt_too_long_is_a_400_before_any_header_even_when_streaming(http, fake):
    message = "prompt has 5000 tokens, max_model_len is 4096"
    for stream in (False, True):
        fake.enqueue(Script(admit_error=(grpc.StatusCode.INVALID_ARGUMENT, message)))
        response = http.post("/v1/chat/completions", json=chat(stream=stream))
        assert assert_openai_error(response, 400)["message"] == message


def test_cache_exhaustion_at_admission_is_a_400(http, fake):
    fake.enqueue(Script(admit_error=(grpc.StatusCode.RESOURCE_EXHAUSTED, "can never fit")))
    assert_openai_error(http.post("/v1/completions", json={"prompt": "x", "stream": True}), 400)


def test_scheduler_unavailable_at_admission_is_a_503(http, fake):
    fake.enqueue(Script(admit_error=(grpc.StatusCode.UNAVAILABLE, "worker lost")))
    assert_openai_error(http.post("/v1/chat/completions", json=chat()), 503)


def test_error_after_admission_without_streaming_is_a_503(http, fake):
    fake.enqueue(Script(text="partial", error_after_tokens=(grpc.StatusCode.UNAVAILABLE, "worker lost")))
    error = assert_openai_error(http.post("/v1/chat/completions", json=chat()), 503)
    assert "worker lost" in error["message"]


def test_unknown_route_and_wrong_method_use_the_error_shape(http):
    assert_openai_error(http.get("/v1/nope"), 404)
    assert_openai_error(http.get("/v1/chat/completions"), 405)


def test_tokenize_rejects_bad_requests(http):
    assert_openai_error(http.post("/tokenize", json={"prompt": 5}), 400, "prompt")
    assert_openai_error(http.post("/detokenize", json={"tokens": [1, "a"]}), 400, "tokens[1]")
    assert_openai_error(http.post("/tokenize", json={"messages": USER_TURN,
                                                     "add_generation_prompt": False}), 400)


def test_unreachable_scheduler_makes_health_and_requests_503(tmp_path, harness):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_address = f"127.0.0.1:{s.getsockname()[1]}"
    config = FrontendConfig(model_dir=harness.model_dir, served_model_name=SERVED_MODEL,
                            scheduler_address=dead_address)
    with TestClient(create_app(config, tokenizer=shared_tokenizer())) as client:
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["reason"]
        assert_openai_error(client.post("/v1/chat/completions", json=chat()), 503)


def test_stall_after_admission_without_streaming_is_a_503_not_a_client_error(http, fake):
    fake.enqueue(Script(text="x", error_after_tokens=(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                      "stalled under cache pressure")))
    assert_openai_error(http.post("/v1/chat/completions", json=chat()), 503)
