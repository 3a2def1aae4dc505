"""SSE framing, failures after the headers, and client disconnects cancelling the scheduler call."""
from __future__ import annotations

import json
import socket

import grpc
import httpx

from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from tests.frontend.fake_scheduler import SERVED_MODEL, Script
from tests.frontend.test_app import WEATHER_CALL_TEXT, WEATHER_TOOL

USER_TURN = [{"role": "user", "content": "hi"}]


def sse_payloads(response: httpx.Response) -> list:
    """The `data:` payloads of an SSE body, checking the framing on the way."""
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = response.text.split("\n\n")
    assert events[-1] == "", "the body ends with a blank line"
    assert all(e.startswith("data: ") for e in events[:-1])
    assert events[-2] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-2]]


def test_chunks_carry_usage_null_until_the_final_usage_chunk(http, fake):
    fake.enqueue(Script(text="one two"))
    body = {"model": SERVED_MODEL, "messages": USER_TURN, "stream": True,
            "stream_options": {"include_usage": True}}
    payloads = sse_payloads(http.post("/v1/chat/completions", json=body))
    assert payloads[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(p["usage"] is None for p in payloads[:-1])
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 3
    assert payloads[-2]["choices"][0]["finish_reason"] == "stop"
    assert {p["object"] for p in payloads} == {"chat.completion.chunk"}


def test_streamed_arguments_equal_the_non_streamed_arguments(http, fake):
    fake.enqueue(Script(text=WEATHER_CALL_TEXT), Script(text=WEATHER_CALL_TEXT))
    body = {"model": SERVED_MODEL, "messages": USER_TURN, "tools": [WEATHER_TOOL]}
    whole = http.post("/v1/chat/completions", json=body).json()
    payloads = sse_payloads(http.post("/v1/chat/completions", json={**body, "stream": True}))
    fragments = [call["function"].get("arguments", "")
                 for p in payloads for call in p["choices"][0]["delta"].get("tool_calls", [])]
    expected = whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert "".join(fragments) == expected
    assert len(fragments) > 2, "arguments arrive as fragments while the call is generated"


def test_error_after_headers_ends_the_stream_with_an_error_event(http, fake):
    fake.enqueue(Script(text="partial answer",
                        error_after_tokens=(grpc.StatusCode.UNAVAILABLE, "worker 0 lost")))
    body = {"model": SERVED_MODEL, "messages": USER_TURN, "stream": True}
    payloads = sse_payloads(http.post("/v1/chat/completions", json=body))
    *chunks, error_event = payloads
    assert "worker 0 lost" in error_event["error"]["message"]
    assert set(error_event["error"]) == {"message", "type", "param", "code"}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "partial answer"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)


def test_text_completion_stream_error_event(http, fake):
    fake.enqueue(Script(text="abc", error_after_tokens=(grpc.StatusCode.RESOURCE_EXHAUSTED, "stalled")))
    payloads = sse_payloads(http.post("/v1/completions", json={"prompt": "x", "stream": True}))
    assert "stalled" in payloads[-1]["error"]["message"]


def test_stream_length_finish_is_reported(http, fake):
    fake.enqueue(Script(text="a b c d e f g h", finish=pb.FINISH_REASON_LENGTH))
    body = {"prompt": "x", "stream": True, "max_tokens": 4,
            "stream_options": {"include_usage": True}}
    payloads = sse_payloads(http.post("/v1/completions", json=body))
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert payloads[-1]["usage"]["completion_tokens"] == 4


def test_disconnect_during_a_stream_cancels_the_scheduler_call(http, fake):
    fake.enqueue(Script(text="first words", hold_after_tokens=True))
    body = {"model": SERVED_MODEL, "messages": USER_TURN, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        request_id = json.loads(first[len("data: "):])["id"]
    assert fake.wait_until(lambda: request_id in fake.cancelled)


def test_disconnect_while_waiting_for_a_non_stream_answer_cancels_the_call(harness, fake):
    fake.enqueue(Script(text="never finished", hold_after_tokens=True))
    body = json.dumps({"model": SERVED_MODEL, "messages": USER_TURN}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", harness.server.port)) as conn:
        conn.sendall(head + body)
        assert fake.wait_until(lambda: len(fake.requests) == 1)
    request_id = fake.requests[0].request_id
    assert fake.wait_until(lambda: request_id in fake.cancelled)


def test_an_internal_failure_mid_stream_still_ends_with_an_error_event(http, fake):
    fake.enqueue(Script(token_ids=[100, 10**7], hold_after_tokens=True))
    body = {"model": SERVED_MODEL, "messages": USER_TURN, "stream": True}
    payloads = sse_payloads(http.post("/v1/chat/completions", json=body))
    assert payloads[-1]["error"]["type"] == "server_error"
    assert fake.wait_until(lambda: payloads[0]["id"] in fake.cancelled)
