"""Serving benchmark against a running stack, in the style of vLLM's `benchmark_serving`.

    python -m bench.serve --base-url http://127.0.0.1:8000 [--concurrency 1,4,16,64 | --request-rate 2,8]
                          [--num-prompts 64] [--constrained-share 0.5] [--prompt-len 128]
                          [--prompt-len-range 0.5] [--output-len 64] [--output-len-range 0.25]
                          [--out bench-serve]

Each level of the sweep sends `--num-prompts` streamed chat completions through the real `openai`
client: at most `c` in flight (closed loop, `--concurrency`), or arriving as a Poisson process of
`r` requests/s (open loop, `--request-rate`). A `--constrained-share` of them carry a strict tool
with `tool_choice: "required"`, so their output is grammar-constrained. Prints TTFT, TPOT (time
per output token after the first, from the usage count), ITL (gaps between output chunks; ITL is
also split by constrained / plain), throughput and errors per level; writes `<out>.json` (every
request's raw figures and each level's summary) and `<out>.png` (latency and throughput against
the swept value). Lengths are drawn uniformly in [len·(1−range), len·(1+range)].
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import httpx
import openai
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.serve_figures import format_level, plot_sweep, summarize  # noqa: E402
from bench.serve_requests import (PlannedRequest, RequestRecord, Workload,  # noqa: E402
                                  plan_requests, run_request)
from services.common.cli_values import positive_int  # noqa: E402

REQUEST_TIMEOUT_S = 600.0


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the frontend, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="unused", help="sent as Bearer (if the stack has keys)")
    parser.add_argument("--model", default=None, help="served model name (default: /v1/models' first)")
    sweep = parser.add_mutually_exclusive_group()
    sweep.add_argument("--concurrency", type=_counts, default=None,
                       help="closed-loop sweep: requests in flight per level (default 1,4,16,64)")
    sweep.add_argument("--request-rate", type=_rates, default=None,
                       help="open-loop sweep: Poisson arrivals, requests/s per level")
    parser.add_argument("--num-prompts", type=positive_int, default=64, help="requests per level")
    parser.add_argument("--constrained-share", type=_share, default=0.5)
    parser.add_argument("--prompt-len", type=positive_int, default=128, help="prompt words (≈ tokens)")
    parser.add_argument("--prompt-len-range", type=_share, default=0.5)
    parser.add_argument("--output-len", type=positive_int, default=64, help="max_tokens")
    parser.add_argument("--output-len-range", type=_share, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-serve"),
                        help="writes <out>.json and <out>.png")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.request_rate is None and args.concurrency is None:
        args.concurrency = [1, 4, 16, 64]
    return args


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return value


def _counts(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",")]


def _rates(text: str) -> list[float]:
    rates = [float(part) for part in text.split(",")]
    if any(rate <= 0 for rate in rates):
        raise argparse.ArgumentTypeError("request rates must be > 0")
    return rates


async def run_level(client: openai.AsyncOpenAI, planned: list[PlannedRequest],
                    concurrency: Optional[int], rate: Optional[float], rng: random.Random,
                    progress: tqdm) -> tuple[list[RequestRecord], float]:
    """Sends one level's requests; returns the records (in plan order) and the wall time."""
    limit = asyncio.Semaphore(concurrency or len(planned))

    async def one(request: PlannedRequest) -> RequestRecord:
        async with limit:
            record = await run_request(client, request)
        progress.update(1)
        return record

    started = time.perf_counter()
    tasks = []
    for request in planned:
        tasks.append(asyncio.create_task(one(request)))
        if rate is not None:
            await asyncio.sleep(rng.expovariate(rate))
    records = await asyncio.gather(*tasks)
    return list(records), time.perf_counter() - started


async def served_model(base_url: str, http: httpx.AsyncClient) -> str:
    response = await http.get(f"{base_url}/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def sweep(args: argparse.Namespace) -> dict[str, Any]:
    base_url = args.base_url.rstrip("/")
    http = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, trust_env=False,
                             limits=httpx.Limits(max_connections=None))
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=args.api_key, max_retries=0,
                                timeout=REQUEST_TIMEOUT_S, http_client=http)
    model = args.model or await served_model(base_url, http)
    workload = Workload(model, args.prompt_len, args.prompt_len_range, args.output_len,
                        args.output_len_range, args.constrained_share)
    swept = ("concurrency", args.concurrency) if args.concurrency else ("request_rate",
                                                                        args.request_rate)
    rng = random.Random(args.seed)
    levels = []
    for value in swept[1]:
        planned = plan_requests(workload, args.num_prompts, rng)
        with tqdm(total=len(planned), desc=f"{swept[0]} {value}", unit="req",
                  disable=args.no_progress, file=sys.stderr) as progress:
            records, duration_s = await run_level(
                client, planned, value if swept[0] == "concurrency" else None,
                value if swept[0] == "request_rate" else None, rng, progress)
        figures = summarize(records, duration_s)
        print(format_level(f"{swept[0]} {value}", figures), flush=True)
        levels.append({"value": value, "figures": figures,
                       "requests": [asdict(record) for record in records]})
    await client.close()
    return {"base_url": base_url, "model": model, "swept": swept[0],
            "workload": asdict(workload), "num_prompts": args.num_prompts, "seed": args.seed,
            "levels": levels}


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    result = asyncio.run(sweep(args))
    json_path, png_path = Path(f"{args.out}.json"), Path(f"{args.out}.png")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1), encoding="utf-8")
    plot_sweep(result["levels"], result["swept"].replace("_", " "), png_path)
    print(f"wrote {json_path} and {png_path}")
    errors = sum(len(level["requests"]) - level["figures"]["completed"]
                 for level in result["levels"])
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
