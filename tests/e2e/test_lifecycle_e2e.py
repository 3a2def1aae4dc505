"""Operators' view of the running stack: cancellation frees everything, errors are plain 400s,
and the scheduler can be inspected with a real grpcurl and no .proto files."""
from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest

from tests.e2e.helpers import describe_usage, grpcurl_path, is_idle, scheduler_state, wait_for

pytestmark = pytest.mark.slow


def _chat(stack, **fields) -> dict:
    body = {"model": stack.served_model_name, "messages": [{"role": "user", "content": "Tell me a story."}]}
    body.update(fields)
    return body


def test_client_disconnect_mid_stream_frees_every_block_within_a_second(stack, http: httpx.Client) -> None:
    with http.stream("POST", "/v1/chat/completions", json=_chat(stack, stream=True, max_tokens=500)) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        content_chunks = 0
        while content_chunks < 3:
            line = next(lines)
            if line.startswith("data: {") and '"content": "' in line:
                content_chunks += 1
        running = scheduler_state(stack.scheduler_address)
        assert running.num_running == 1, describe_usage(running)
    disconnected_at = time.monotonic()
    state = wait_for(lambda: (s := scheduler_state(stack.scheduler_address)) and is_idle(s) and s, 1.0)
    elapsed = time.monotonic() - disconnected_at
    final = scheduler_state(stack.scheduler_address)
    assert state, f"still busy {elapsed:.2f}s after the disconnect: {describe_usage(final)}"


def test_abort_rpc_through_stop_strings_ends_the_request(stack, http: httpx.Client) -> None:
    """A stop string the model happens to produce ends the request early and frees it."""
    reference = http.post("/v1/chat/completions", json=_chat(stack, max_tokens=12)).json()
    text = reference["choices"][0]["message"]["content"]
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip(), f"need a visible stop string from {text!r}"
    stopped = http.post("/v1/chat/completions", json=_chat(stack, max_tokens=12, stop=[stop])).json()
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == text[:text.index(stop)]
    assert wait_for(lambda: is_idle(scheduler_state(stack.scheduler_address)), 5.0)


def test_prompt_longer_than_max_model_len_is_a_400_before_any_header(stack, http: httpx.Client) -> None:
    long_text = "word " * 5000  # the e2e stack runs with --max-model-len 2048
    for stream in (False, True):
        response = http.post("/v1/chat/completions", json=_chat(
            stack, stream=stream, messages=[{"role": "user", "content": long_text}]))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert "2048" in error["message"], error
        assert len(response.content) < 2000, "the error body must not echo the prompt"


def test_non_greedy_temperature_is_rejected_with_an_explanation(stack, http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=_chat(stack, temperature=0.7))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "temperature" and "greedy" in error["message"].lower()


def test_grpcurl_lists_services_and_reads_state_without_proto_files(stack, tmp_path) -> None:
    listed = subprocess.run([grpcurl_path(), "-plaintext", stack.scheduler_address, "list"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    services = set(listed.stdout.split())
    assert {"dsv4serve.v1.Scheduler", "grpc.health.v1.Health"} <= services, listed.stdout

    described = subprocess.run([grpcurl_path(), "-plaintext", stack.scheduler_address, "describe",
                                "dsv4serve.v1.Scheduler"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=60)
    assert "GetSchedulerState" in described.stdout, described.stderr

    called = subprocess.run([grpcurl_path(), "-plaintext", "-d", '{"include_requests": true}',
                             stack.scheduler_address, "dsv4serve.v1.Scheduler/GetSchedulerState"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert called.returncode == 0, called.stderr
    state = json.loads(called.stdout)
    groups = [group for partition in state["partitions"] for group in partition["groups"]]
    assert {group["group"] for group in groups} >= {"window", "compressed"}
    # grpcurl prints proto field names or lowerCamelCase depending on its version.
    assert all(int(group.get("total_blocks", group.get("totalBlocks", 0))) > 0 for group in groups)
    assert state["workers"][0]["connected"] is True
