"""DSpark speculation on a sharded layout through the services: replies and wall times, K=0 vs K.

    python -m bench.bench_sharded_speculation [--layout 4,4,16] [--k 7] [--preset tiny-ep16-dspark]

Starts `dsv4serve stack` on the layout twice — target only, then DSpark with K drafts — on a tiny
preset with a (random) DSpark draft, and sends each the same requests one after the other: a
`required` tool call and a plain chat. Prints the time to ready, every request's wall time and
completion tokens, whether the K > 0 replies equal the K = 0 ones, and the spec-decode counters. A
random draft rarely agrees with the target, so this measures what lockstep drafting costs on the
layout (every rank runs the draft stages every step), not what a trained draft gains.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.stack_load import LocalStack
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
REQUESTS = (
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [TOOL],
     "tool_choice": "required", "max_tokens": 40, "temperature": 0},
    {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 32, "temperature": 0},
)
COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")


def run_stack(model_dir: Path, flags: tuple[str, ...]) -> tuple[float, list[tuple], dict]:
    """(seconds to ready, per request (wall s, completion tokens, message), spec counters)."""
    started = time.monotonic()
    with LocalStack(model_dir, flags) as stack:
        ready_s = time.monotonic() - started
        replies = []
        with httpx.Client(base_url=stack.base_url, timeout=900, trust_env=False) as http:
            for request in REQUESTS:
                sent = time.monotonic()
                answer = http.post("/v1/chat/completions", json={"model": "bench", **request})
                answer.raise_for_status()
                body = answer.json()
                replies.append((time.monotonic() - sent, body["usage"]["completion_tokens"],
                                body["choices"][0]["message"]))
            metrics = http.get("/metrics").text
    return ready_s, replies, spec_counters(metrics)


def spec_counters(metrics: str) -> dict[str, float]:
    names = {f"dsv4serve:spec_decode_num_{name}_total": name for name in COUNTERS}
    return {names[s.name]: s.value for family in text_string_to_metric_families(metrics)
            for s in family.samples if s.name in names}


def report(label: str, ready_s: float, replies: list[tuple], counters: dict[str, Any]) -> None:
    print(f"{label}: ready after {ready_s:.1f} s")
    for (wall_s, tokens, _), request in zip(replies, REQUESTS):
        kind = "tool call" if "tools" in request else "chat"
        print(f"  {kind:9s} {tokens:3d} tokens in {wall_s:6.2f} s ({tokens / wall_s:.2f} tok/s)")
    if counters:
        print("  " + ", ".join(f"{name} {int(value)}" for name, value in counters.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default="4,4,16", help="dp,tp,ep (ep = dp·tp for DSpark)")
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--preset", default="tiny-ep16-dspark")
    args = parser.parse_args()
    dp, tp, ep = args.layout.split(",")
    layout = ("--dp", dp, "--tp", tp, "--ep", ep, "--kv-cache-memory", "64MiB")
    spec = json.dumps({"method": "dspark", "num_speculative_tokens": args.k})
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = write_tiny_checkpoint(Path(scratch), preset=args.preset, seed=1)
        print(f"{args.preset}, dp {dp} × tp {tp}, ep {ep}; requests one after the other")
        k0 = run_stack(model_dir, layout)
        report("K=0", *k0)
        spec_run = run_stack(model_dir, layout + ("--speculative-config", spec))
        report(f"K={args.k}", *spec_run)
    same = [a[2] == b[2] for a, b in zip(k0[1], spec_run[1])]
    print(f"K={args.k} replies equal the K=0 ones: {all(same)} {same}")


if __name__ == "__main__":
    main()
