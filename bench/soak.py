"""Soak test of a running `dsv4serve stack`: many concurrent streams for a long time, with aborts.

    dsv4serve stack --ready-file /tmp/stack.json …  &
    python -m bench.soak --ready-file /tmp/stack.json [--streams 64] [--duration-s 600]

Each of `--streams` clients streams chat requests back to back until the duration is over. A
`--constrained-fraction` of them (30%) use `tool_choice: "required"` with one strict tool, steered by
logit_bias towards closing tokens so the random default model finishes its calls (a `length` finish
is accepted; a finished call must parse and match the schema). Every `--abort-every`-th request (over
all clients) disconnects after a few chunks (a client going away mid-stream).

Prints errors by kind, the RSS of every stack process (worker ranks included) at the start and the
end, and what the scheduler still holds once traffic stopped (target: 0 errors, flat RSS, 0 leaks).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

from services.common.config import TlsConfig
from tests.e2e.helpers import describe_usage, is_idle, scheduler_state, steering_bias, wait_for

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
PROMPTS = ("Hello!", "What is the weather in Paris?", "Write a haiku about the sea.",
           "List three prime numbers.")


@dataclass
class Tally:
    requests: int = 0
    completed: int = 0
    aborted: int = 0
    tool_calls: int = 0
    tokens: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)


@dataclass(frozen=True)
class Plan:
    model: str
    max_tokens: int
    constrained_max_tokens: int  # enough for the steered random model to close its call
    constrained_fraction: float
    abort_every: int
    bias: dict[str, int]


def request_body(plan: Plan, client: int, number: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": plan.model, "stream": True, "max_tokens": plan.max_tokens,
                            "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": PROMPTS[number % len(PROMPTS)]}]}
    if client % 10 < round(plan.constrained_fraction * 10):
        body.update(tools=[WEATHER_TOOL], tool_choice="required", logit_bias=plan.bias,
                    max_tokens=plan.constrained_max_tokens)
    return body


async def one_stream(http: httpx.AsyncClient, body: dict[str, Any], abort: bool, tally: Tally) -> None:
    data: list[str] = []
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            tally.errors[f"http {response.status_code}"] += 1
            return
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data.append(line[len("data: "):])
                if abort and len(data) >= 3:
                    tally.aborted += 1
                    return  # leaving the block closes the connection: a client disconnect
    problem = check_stream(data, "tools" in body, tally)
    if problem:
        tally.errors[problem] += 1
    else:
        tally.completed += 1


def check_stream(data: list[str], constrained: bool, tally: Tally) -> Optional[str]:
    """None when the stream is a complete, well-formed answer; else the kind of error."""
    if not data or data[-1] != "[DONE]":
        return "no [DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    if any("error" in c for c in chunks):
        return "error event: " + next(c for c in chunks if "error" in c)["error"].get("code", "?")
    finishes = [c["choices"][0]["finish_reason"] for c in chunks
                if c.get("choices") and c["choices"][0].get("finish_reason")]
    if len(finishes) != 1:
        return "no finish_reason"
    usage = chunks[-1].get("usage") or {}
    tally.tokens += usage.get("completion_tokens", 0)
    if finishes[0] == "tool_calls":
        tally.tool_calls += 1
        return check_tool_call(chunks)
    expected = ("length", "tool_calls") if constrained else ("stop", "length")
    return None if finishes[0] in expected else f"finish_reason {finishes[0]}"


def check_tool_call(chunks: list[dict[str, Any]]) -> Optional[str]:
    arguments = "".join(call["function"].get("arguments", "") for c in chunks if c.get("choices")
                        for call in c["choices"][0]["delta"].get("tool_calls") or [])
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return "tool call arguments are not JSON"
    ok = isinstance(parsed, dict) and set(parsed) == {"city"} and isinstance(parsed["city"], str)
    return None if ok else "tool call arguments do not match the schema"


async def client_loop(http: httpx.AsyncClient, plan: Plan, client: int, deadline: float,
                      tally: Tally) -> None:
    for number in itertools.count(1):
        if time.monotonic() >= deadline:
            return
        tally.requests += 1  # every abort_every-th request over all clients disconnects early
        abort = plan.abort_every > 0 and tally.requests % plan.abort_every == 0
        try:
            await one_stream(http, request_body(plan, client, number), abort, tally)
        except httpx.HTTPError as error:
            tally.errors[type(error).__name__] += 1


async def run_clients(base_url: str, plan: Plan, streams: int, duration_s: float,
                      pids: dict[str, int]) -> tuple[Tally, dict[str, float]]:
    """The tally, and the RSS once a tenth of the duration has passed (caches warmed up)."""
    tally = Tally()
    deadline = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=streams * 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits, trust_env=False) as http:
        warm_rss: dict[str, float] = {}
        warm = asyncio.create_task(asyncio.sleep(duration_s / 10))
        warm.add_done_callback(lambda _: warm_rss.update(rss_mib(pids)))
        await asyncio.gather(*(client_loop(http, plan, i, deadline, tally) for i in range(streams)))
    return tally, warm_rss


def rss_mib(pids: dict[str, int]) -> dict[str, float]:
    """RSS of each stack process, and of every process the worker spawned (its ranks)."""
    found = {name: _rss_kib(pid) / 1024 for name, pid in pids.items()}
    for child in _children(pids["worker"]):
        found[f"worker rank (pid {child})"] = _rss_kib(child) / 1024
    return found


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _children(parent: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return sorted(children)


def report(tally: Tally, rss: list[dict[str, float]], state: Any, idle: bool,
           duration_s: float) -> None:
    print(f"duration {duration_s:.0f}s: {tally.requests} requests, {tally.completed} completed, "
          f"{tally.aborted} aborted by the client, {tally.tool_calls} tool calls, "
          f"{tally.tokens} completion tokens ({tally.tokens / duration_s:.1f} tok/s)")
    print(f"errors: {sum(tally.errors.values())}" +
          "".join(f"\n  {count:6d}  {kind}" for kind, count in tally.errors.most_common()))
    print("RSS (MiB)                  start   warm (10%)     end")
    for name in rss[0]:
        print(f"  {name:24s}" + "".join(f" {sample.get(name, float('nan')):10.1f}" for sample in rss))
    used = sum(g.used_blocks for p in state.partitions for g in p.groups)
    print(f"scheduler after traffic: idle={idle} leaked blocks={used} live matchers="
          f"{state.num_live_matchers} running={state.num_running} waiting={state.num_waiting} "
          f"grammar_pending={state.num_grammar_pending}\n  {describe_usage(state)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ready-file", type=Path, required=True, help="the stack launcher's --ready-file")
    parser.add_argument("--model", type=Path, default=None, help="the stack's model dir (default: the tiny model)")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--constrained-fraction", type=float, default=0.3)
    parser.add_argument("--abort-every", type=int, default=10, help="every N-th request disconnects early")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--constrained-max-tokens", type=int, default=160)
    parser.add_argument("--tls-cert", type=Path)
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--tls-ca", type=Path)
    args = parser.parse_args()
    ready = json.loads(args.ready_file.read_text())
    tls = TlsConfig(args.tls_cert, args.tls_key, args.tls_ca)
    from services.worker.model.tiny_checkpoint import default_model_dir

    plan = Plan(ready["served_model_name"], args.max_tokens, args.constrained_max_tokens,
                args.constrained_fraction, args.abort_every,
                steering_bias(args.model or default_model_dir()))
    rss_start = rss_mib(ready["pids"])
    started = time.monotonic()
    tally, rss_warm = asyncio.run(run_clients(ready["base_url"], plan, args.streams, args.duration_s,
                                              ready["pids"]))
    duration_s = time.monotonic() - started
    idle = bool(wait_for(lambda: is_idle(scheduler_state(ready["scheduler_address"], tls=tls)), 60, 0.5))
    state = scheduler_state(ready["scheduler_address"], tls=tls)
    report(tally, [rss_start, rss_warm, rss_mib(ready["pids"])], state, idle, duration_s)


if __name__ == "__main__":
    main()
