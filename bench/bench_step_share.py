"""Where a step's time goes in the running stack: the share that is the ranks' compute.

    python -m bench.bench_step_share [--batch 8 32] [--rounds 3] [--model DIR]

For each batch size and scheduler mode (async scheduling on, off), a stack (`dsv4serve stack`)
decodes `--rounds` rounds of `--batch` concurrent streaming completions (32-token prompts, 33
tokens each). Before and after, /metrics gives `dsv4serve:step_seconds_total` (the workers' time on
steps as the scheduler sees it, overlapping steps counted once) and
`dsv4serve:worker_forward_seconds_total` (the ranks computing); their difference's ratio is the
share of step time that is model compute. Unlike a side-by-side with the bare forward, the ratio
is formed within one run, so a noisy machine slows both sides alike. Default model: tiny-a.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.stack_load import LocalStack, concurrent_streams, decode_tokens_per_s, token_prompts
from services.worker.model.tiny_checkpoint import default_model_dir

COUNTERS = ("dsv4serve:step_seconds_total", "dsv4serve:worker_forward_seconds_total",
            "dsv4serve:scheduler_steps_total")


def counters(base_url: str) -> dict[str, float]:
    text = httpx.get(f"{base_url}/metrics", trust_env=False).text
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name in COUNTERS}


def measure(model_dir: Path, batch: int, rounds: int, mode_flag: str) -> str:
    body = {"model": "bench", "max_tokens": 33, "temperature": 0}
    with LocalStack(model_dir, ("--max-num-seqs", str(max(8, batch)), mode_flag)) as stack:
        concurrent_streams(stack.base_url, "/v1/completions",
                           [{**body, "max_tokens": 4, "prompt": [0, 5, 6]}])  # warm-up
        before = counters(stack.base_url)
        rates = [decode_tokens_per_s(concurrent_streams(
            stack.base_url, "/v1/completions",
            [{**body, "prompt": prompt} for prompt in token_prompts(batch, 32)]))
            for _ in range(rounds)]
        after = counters(stack.base_url)
    step_s, forward_s, steps = (after[name] - before[name] for name in COUNTERS)
    return (f"batch {batch:3d} {mode_flag:22s} compute share {forward_s / step_s:.3f}  "
            f"({steps:.0f} steps: {1000 * step_s / steps:.1f} ms each, compute "
            f"{1000 * forward_s / steps:.1f} ms; decode {sorted(rates)[len(rates) // 2]:.0f} tok/s)")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: tiny-a)")
    args = parser.parse_args(argv)
    model_dir = args.model or default_model_dir()
    for batch in args.batch:
        for flag in ("--async-scheduling", "--no-async-scheduling"):
            print(measure(model_dir, batch, args.rounds, flag), flush=True)


if __name__ == "__main__":
    main()
