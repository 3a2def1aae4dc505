"""Time to first token of turn 6 of a tool conversation, with and without prefix caching.

    python -m bench.bench_prefix_cache [--system-tokens 2000] [--repeats 3]

An agent's conversation: a long system prompt and a tool list, then six turns, each appending the
assistant's tool call and the tool's result (an agent log replayed by the client). Every turn is
sent to the stack (the warm stack caches each turn's prompt as it goes); turn 6 is then streamed and
its time to first token measured, on a stack with prefix caching and on one started with
`--no-enable-prefix-caching`. Also prints the warm stack's prefix-cache hit rate over the turns
(vllm:prefix_cache_hits / vllm:prefix_cache_queries). Default tiny model on CPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.stack_load import LocalStack
from services.worker.model.tiny_checkpoint import default_model_dir

STACK_FLAGS = ("--max-model-len", "8192", "--max-num-batched-tokens", "8192")
TOOLS = [{"type": "function", "function": {
    "name": "run_shell", "description": "Run a shell command in the project checkout",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"},
                                                    "timeout_s": {"type": "integer"}},
                   "required": ["command"]}}}]


def conversation(system_words: int, turns: int) -> list[dict[str, Any]]:
    """System + user, then `turns` tool calls with their results (turn k's prompt is the first
    2 + 2·(k − 1) messages)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent. " * (system_words // 6)},
        {"role": "user", "content": "The tests of the scheduler fail; find out why and fix it."}]
    for turn in range(turns):
        arguments = json.dumps({"command": f"pytest -q tests/scheduler -k case_{turn}",
                                "timeout_s": 600})
        messages.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{turn}", "type": "function",
            "function": {"name": "run_shell", "arguments": arguments}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}",
                         "content": f"FAILED tests/scheduler/test_case_{turn}.py - assert "
                                    f"{turn} == {turn + 1}\n1 failed, 40 passed in 3.1s"})
    return messages


def body(stack: LocalStack, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    return {"model": "bench", "messages": messages, "tools": TOOLS, "max_tokens": 8,
            "temperature": 0, "stream": stream}


def first_token_s(stack: LocalStack, messages: list[dict[str, Any]]) -> float:
    started = time.perf_counter()
    with httpx.Client(base_url=stack.base_url, timeout=600, trust_env=False) as http:
        with http.stream("POST", "/v1/chat/completions", json=body(stack, messages, True)) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                for choice in json.loads(line[len("data: "):]).get("choices", []):
                    delta = choice.get("delta", {})
                    if delta.get("content") or delta.get("tool_calls") or \
                            delta.get("reasoning_content"):
                        return time.perf_counter() - started
    raise RuntimeError("the stream carried no token")


def counter(stack: LocalStack, name: str) -> float:
    text = httpx.get(f"{stack.base_url}/metrics", trust_env=False, timeout=30).text
    return next(s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == name)


def turn_six_ttft(extra_flags: tuple[str, ...], system_words: int,
                  repeats: int) -> tuple[float, float, int]:
    """(median TTFT of turn 6, hit rate over turns 1..6, turn-6 prompt tokens) on a fresh stack;
    each repeat replays the conversation with a different system prompt (nothing shared)."""
    ttfts, hits, queries, prompt_tokens = [], 0.0, 0.0, 0
    with LocalStack(default_model_dir(), STACK_FLAGS + extra_flags) as stack:
        for repeat in range(repeats):
            messages = conversation(system_words, 5)
            messages[0]["content"] = f"Session {repeat}. " + messages[0]["content"]
            hits_before = counter(stack, "vllm:prefix_cache_hits_total")
            queries_before = counter(stack, "vllm:prefix_cache_queries_total")
            with httpx.Client(base_url=stack.base_url, timeout=600, trust_env=False) as http:
                for turn in range(1, 6):
                    reply = http.post("/v1/chat/completions",
                                      json=body(stack, messages[:2 * turn], False))
                    reply.raise_for_status()
                prompt_tokens = http.post("/tokenize", json={
                    "model": "bench", "messages": messages, "tools": TOOLS}).json()["count"]
            ttfts.append(first_token_s(stack, messages))
            hits += counter(stack, "vllm:prefix_cache_hits_total") - hits_before
            queries += counter(stack, "vllm:prefix_cache_queries_total") - queries_before
    return statistics.median(ttfts), hits / queries if queries else 0.0, prompt_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system-tokens", type=int, default=2000,
                        help="about how long the system prompt is")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    words = args.system_tokens * 3 // 4
    warm, hit_rate, tokens = turn_six_ttft((), words, args.repeats)
    cold, _, _ = turn_six_ttft(("--no-enable-prefix-caching",), words, args.repeats)
    print(f"turn 6 prompt: {tokens} tokens; median of {args.repeats} conversations")
    print(f"TTFT turn 6: warm {1e3 * warm:.0f} ms, cold {1e3 * cold:.0f} ms, "
          f"warm/cold {warm / cold:.2f}")
    print(f"prefix-cache hit rate over turns 1-6 (warm stack): {hit_rate:.2f}")


if __name__ == "__main__":
    main()
