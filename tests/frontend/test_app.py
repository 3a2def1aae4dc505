"""The gateway's OpenAI endpoints against a fake scheduler, through a real uvicorn server.

The `openai` client is used unmodified wherever a user would use it; plain httpx where the test
looks at raw shapes (vLLM-style endpoints, request fields forwarded to the scheduler).
"""
from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from tests.frontend.fake_scheduler import MAX_MODEL_LEN, SERVED_MODEL, GatewayHarness, Script

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}
WEATHER_CALL_TEXT = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
                     '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                     '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
                     '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
USER_TURN = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(harness: GatewayHarness):
    return openai.OpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)


def test_non_stream_chat_returns_the_scripted_answer_with_usage(client, fake, harness):
    fake.enqueue(Script(text="Paris is sunny."))
    response = client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN)
    choice = response.choices[0]
    assert choice.message.content == "Paris is sunny."
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert response.id.startswith("chatcmpl-")
    assert response.model == SERVED_MODEL
    sent = fake.requests[-1]
    assert response.usage.prompt_tokens == len(sent.prompt_token_ids)
    assert response.usage.completion_tokens == len(harness.tokenizer.encode("Paris is sunny.")) + 1
    assert harness.sent_prompt().endswith("What is the weather in Paris?<｜Assistant｜></think>")
    assert sent.request_id == response.id


def test_stream_chat_sends_role_first_then_content_then_finish(client, fake):
    fake.enqueue(Script(text="Paris is sunny today."))
    chunks = list(client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "Paris is sunny today."
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1
    assert all(c.usage is None for c in chunks)


def test_stream_with_include_usage_ends_with_a_usage_chunk(client, fake):
    fake.enqueue(Script(text="Sunny."))
    chunks = list(client.chat.completions.create(
        model=SERVED_MODEL, messages=USER_TURN, stream=True,
        stream_options={"include_usage": True}))
    *body, last = chunks
    assert last.choices == []
    assert last.usage.prompt_tokens == len(fake.requests[-1].prompt_token_ids)
    assert last.usage.completion_tokens == last.usage.total_tokens - last.usage.prompt_tokens > 0
    assert all(c.usage is None for c in body)
    assert body[-1].choices[0].finish_reason == "stop"


def test_tool_call_round_trip(client, fake, harness):
    fake.enqueue(Script(text=WEATHER_CALL_TEXT), Script(text="It will be sunny for 3 days."))
    first = client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN,
                                           tools=[WEATHER_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert not choice.message.content

    history = USER_TURN + [choice.message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24C"}]
    second = client.chat.completions.create(model=SERVED_MODEL, messages=history,
                                            tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == "It will be sunny for 3 days."
    assert second.choices[0].finish_reason == "stop"
    prompt = harness.sent_prompt()
    assert '<｜DSML｜invoke name="get_weather">' in prompt and "sunny, 24C" in prompt


def test_streamed_tool_call_sends_id_and_name_once_then_arguments(client, fake):
    fake.enqueue(Script(text=WEATHER_CALL_TEXT))
    chunks = list(client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN,
                                                 tools=[WEATHER_TOOL], stream=True))
    tool_deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    headers = [d for d in tool_deltas if d.id is not None]
    assert len(headers) == 1 and headers[0].function.name == "get_weather"
    assert headers[0].type == "function" and headers[0].index == 0
    assert all(d.index == 0 and d.function.name is None for d in tool_deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in tool_deltas)
    assert json.loads(arguments) == {"city": "Paris", "days": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(not (c.choices and c.choices[0].delta.content) for c in chunks)


def test_thinking_mode_returns_reasoning_content(client, fake, harness):
    fake.enqueue(Script(text="2 plus 2 is 4.</think>The answer is 4."))
    response = client.chat.completions.create(
        model=SERVED_MODEL, messages=[{"role": "user", "content": "2+2?"}],
        extra_body={"chat_template_kwargs": {"thinking": True}})
    message = response.choices[0].message
    assert message.content == "The answer is 4."
    assert message.model_extra["reasoning_content"] == "2 plus 2 is 4."
    assert harness.sent_prompt().endswith("<｜Assistant｜><think>")


def test_thinking_mode_streams_reasoning_before_content(client, fake):
    fake.enqueue(Script(text="Think hard.</think>Done.", tokens_per_delta=2))
    chunks = list(client.chat.completions.create(
        model=SERVED_MODEL, messages=[{"role": "user", "content": "go"}], stream=True,
        extra_body={"chat_template_kwargs": {"thinking": True}}))
    deltas = [c.choices[0].delta for c in chunks]
    reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == ("Think hard.", "Done.")


def test_max_tokens_is_forwarded_and_length_is_reported(client, fake):
    fake.enqueue(Script(text="one two three four five six seven"))
    response = client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN, max_tokens=3)
    assert fake.requests[-1].sampling.max_tokens == 3
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 3


def test_truncated_tool_call_is_not_presented_as_a_call(client, fake):
    fake.enqueue(Script(text=WEATHER_CALL_TEXT))
    response = client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN,
                                              tools=[WEATHER_TOOL], max_tokens=12)
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.tool_calls
    assert "DSML" not in (choice.message.content or "")


def test_generate_defaults_apply_when_max_tokens_is_absent(client, fake, harness):
    client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN)
    assert fake.requests[-1].sampling.max_tokens == harness.config.generate_defaults.max_new_tokens


def test_required_tool_choice_sends_a_structural_tag_constraint(client, fake):
    fake.enqueue(Script(text=WEATHER_CALL_TEXT))
    response = client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN,
                                              tools=[WEATHER_TOOL], tool_choice="required")
    sent = fake.requests[-1]
    assert sent.constraint.type == pb.CONSTRAINT_TYPE_STRUCTURAL_TAG
    assert "get_weather" in sent.constraint.spec
    assert response.choices[0].finish_reason == "tool_calls"


def test_logit_bias_and_seed_are_accepted(client, fake):
    client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN,
                                   logit_bias={"15": -100, "42": 5.5}, seed=7, temperature=0)
    biases = {b.token_id: b.bias for b in fake.requests[-1].sampling.logit_bias}
    assert biases == {15: -100.0, 42: 5.5}


def test_text_completion_with_text_prompt_adds_bos(client, fake, harness):
    fake.enqueue(Script(text=" world", finish=pb.FINISH_REASON_STOP))
    response = client.completions.create(model=SERVED_MODEL, prompt="Hello")
    assert response.choices[0].text == " world"
    assert response.choices[0].finish_reason == "stop"
    sent = list(fake.requests[-1].prompt_token_ids)
    assert sent == [harness.tokenizer.bos_token_id, *harness.tokenizer.encode("Hello")]


def test_text_completion_with_token_ids_streams(client, fake):
    fake.enqueue(Script(text="abc def ghi"))
    chunks = list(client.completions.create(model=SERVED_MODEL, prompt=[0, 100, 200], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "abc def ghi"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert list(fake.requests[-1].prompt_token_ids) == [0, 100, 200]


def test_models_lists_the_served_model(client):
    [model] = client.models.list().data
    assert model.id == SERVED_MODEL
    assert model.model_extra["max_model_len"] == MAX_MODEL_LEN


def test_tokenize_prompt_and_chat_and_detokenize(http, harness):
    prompt = http.post("/tokenize", json={"model": SERVED_MODEL, "prompt": "Hello world"}).json()
    assert prompt["tokens"] == [0, *harness.tokenizer.encode("Hello world")]
    assert prompt["count"] == len(prompt["tokens"]) and prompt["max_model_len"] == MAX_MODEL_LEN
    chat = http.post("/tokenize", json={"model": SERVED_MODEL, "messages": USER_TURN,
                                        "chat_template_kwargs": {"thinking": True}}).json()
    text = http.post("/detokenize", json={"model": SERVED_MODEL, "tokens": chat["tokens"]}).json()
    assert text["prompt"].startswith("<｜begin▁of▁sentence｜>")
    assert text["prompt"].endswith("What is the weather in Paris?<｜Assistant｜><think>")


def test_tokenize_matches_every_chat_encoding_case(http):
    cases_file = Path(__file__).resolve().parents[1] / "data" / "chat_encoding_cases.jsonl"
    cases = [json.loads(line) for line in cases_file.read_text().splitlines() if line.strip()]
    assert cases
    for case in cases:
        body = {**case["request"], "model": SERVED_MODEL, "add_generation_prompt": True}
        response = http.post("/tokenize", json=body)
        assert response.status_code == 200, (case["id"], response.text)
        assert response.json()["tokens"] == case["expected_token_ids"], case["id"]


def test_stop_string_cuts_the_text_and_cancels_generation(client, fake):
    fake.enqueue(Script(text="alpha beta gamma delta", hold_after_tokens=True))
    response = client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN, stop=["gam"])
    assert response.choices[0].message.content == "alpha beta "
    assert response.choices[0].finish_reason == "stop"
    assert fake.wait_until(lambda: response.id in fake.cancelled)


def test_stop_string_split_across_tokens_in_a_stream(client, fake):
    fake.enqueue(Script(text="one two three four", hold_after_tokens=True))
    chunks = list(client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN,
                                                 stop=["wo thr", "zzz"], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "one t"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert fake.wait_until(lambda: chunks[0].id in fake.cancelled)


def test_health_is_200_only_when_the_scheduler_reports_ready(http, fake):
    ok = http.get("/health")
    assert ok.status_code == 200
    fake.ready, fake.ready_reason = False, "worker 127.0.0.1:1 unreachable"
    down = http.get("/health")
    assert down.status_code == 503
    assert "unreachable" in down.json()["reason"]


def test_metrics_report_scheduler_gauges_and_latency_histograms(client, fake, http):
    client.chat.completions.create(model=SERVED_MODEL, messages=USER_TURN)
    samples = {(s.name, s.labels.get("le")): s for family in
               text_string_to_metric_families(http.get("/metrics").text) for s in family.samples}
    model = {"model_name": SERVED_MODEL}
    assert samples[("vllm:num_requests_running", None)] == Sample("vllm:num_requests_running", model, 3)
    assert samples[("vllm:num_requests_waiting", None)].value == 2
    assert samples[("vllm:kv_cache_usage_perc", None)].value == 0.25
    assert samples[("vllm:time_to_first_token_seconds_count", None)].value >= 1
    assert samples[("vllm:generation_tokens_total", None)].value > 0
    assert ("vllm:e2e_request_latency_seconds_bucket", "+Inf") in samples
    assert samples[("vllm:prefix_cache_queries_total", None)].value == 900
    assert samples[("vllm:prefix_cache_hits_total", None)].value == 600
    assert samples[("dsv4serve:constrained_preemptions_total", None)].value == 1
    assert samples[("dsv4serve:partition_prefix_cache_blocks", None)].value == 40
    assert samples[("dsv4serve:partition_prefix_cache_hits_total", None)].value == 600
    assert samples[("dsv4serve:step_seconds_total", None)].value == 2.5
    assert samples[("dsv4serve:worker_forward_seconds_total", None)].value == 2.0

def test_a_plain_x_request_id_is_echoed_and_anything_else_replaced(http, fake):
    fake.enqueue(Script(text="Hi."), Script(text="Hi."))
    body = {"model": SERVED_MODEL, "messages": USER_TURN}
    kept = http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "lb-1234:abc"})
    assert kept.headers["X-Request-Id"] == "lb-1234:abc"
    forged = http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "a b\\n[ERROR] x"})
    assert forged.status_code == 200
    assert forged.headers["X-Request-Id"] not in ("a b\\n[ERROR] x", "") and " " not in forged.headers["X-Request-Id"]
    assert http.get("/v1/models").headers["X-Request-Id"]
