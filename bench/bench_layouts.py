"""Decode throughput of parallel layouts on this machine's CPUs, with the time spent in collectives.

    python bench/bench_layouts.py [--batch 32] [--tokens 16] [--layouts 1,1,1 2,2,4 4,4,16]

Each layout runs as real rank processes in one gloo world (`layout_run`, no services): the batch is
dealt to the DP groups, prefilled, then decoded; the figures are the decode steps' wall time (the
slowest partition leader) and the part of it inside collectives. With more ranks than cores the
ranks share the cores, so expect a slowdown on a small machine: the collective share says how
much of it is synchronisation rather than math.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.worker.model.layout_run import Workload, run_layout  # noqa: E402
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint  # noqa: E402


def layout(text: str) -> tuple[int, int, int]:
    dp, tp, ep = (int(part) for part in text.split(","))
    return dp, tp, ep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16, help="tokens decoded per request")
    parser.add_argument("--preset", default="tiny-ep16")
    parser.add_argument("--layouts", type=layout, nargs="+",
                        default=[(1, 1, 1), (1, 4, 4), (4, 1, 4), (2, 2, 4), (4, 4, 16)])
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    prompts = tuple(tuple(torch.randint(2, 129_000, (args.prompt_len,),
                                        generator=generator).tolist())
                    for _ in range(args.batch))
    workload = Workload(prompts, args.tokens)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = write_tiny_checkpoint(scratch, preset=args.preset)
        print(f"{args.preset}, batch {args.batch}, prompt {args.prompt_len}, "
              f"{args.tokens} tokens each, float32, 1 thread per rank")
        baseline = None
        for dp, tp, ep in args.layouts:
            run = run_layout(model_dir, dp, tp, ep, workload)
            rate = run.decode_tokens / run.decode_s
            baseline = baseline or rate
            steps = args.tokens - 1
            print(f"dp{dp} tp{tp} ep{ep:<2} ({dp * tp:2d} ranks)  decode {rate:7.1f} tok/s "
                  f"({rate / baseline:4.2f}x)  step {1e3 * run.decode_s / steps:7.1f} ms  "
                  f"collectives {1e3 * run.collective_s / steps:7.1f} ms/step "
                  f"({100 * run.collective_s / run.decode_s:4.1f}%)")


if __name__ == "__main__":
    main()
