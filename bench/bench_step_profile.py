"""Where a decode step's time goes: the runtime's Python functions and the device's operators.

    python -m bench.bench_step_profile [--model DIR] [--batch 8] [--steps 8]
                                       [--device cuda:0 --dtype bfloat16] [--top 25]

Three rounds of `ForwardDecode.measure` (bench_e2e_vs_forward.py: `--batch` sequences prefilled, one
warm-up decode step, `--steps` timed decode steps): unprofiled, then under cProfile (the Python
functions with the most cumulative time inside `services/`), then under torch.profiler (operators
by self host time, and — on CUDA — the kernel launches and host↔device copies and synchronizations
per step, which bound a small model's step on a GPU). Default model: tiny-a.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
from collections import Counter
from pathlib import Path
from typing import Optional

import torch
from torch.profiler import ProfilerActivity, profile

from bench.bench_e2e_vs_forward import ForwardDecode, add_forward_arguments

# Host-side CUDA runtime calls that mark a launch, a copy or a wait.
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync",
                 "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def python_profile(forward: ForwardDecode, steps: int, top: int) -> None:
    profiler = cProfile.Profile()
    forward.measure(profiler)
    stats = pstats.Stats(profiler)
    rows = [(cum, calls, f"{Path(file).name}:{line} {name}")
            for (file, line, name), (_, calls, _, cum, _) in stats.stats.items()
            if "/services/" in file]
    print(f"Python, cumulative time per decode step (cProfile, {steps} steps; profiler overhead "
          "inflates small functions):")
    for cum, calls, where in sorted(rows, reverse=True)[:top]:
        print(f"  {cum / steps * 1e3:9.2f} ms  {calls / steps:8.1f} calls/step  {where}")


def operator_profile(forward: ForwardDecode, steps: int, top: int, on_cuda: bool) -> None:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    prof = profile(activities=activities)
    forward.measure(prof)
    averages = prof.key_averages()
    print(f"\noperators by self host time per decode step (torch.profiler, {steps} steps):")
    for event in sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]:
        print(f"  {event.self_cpu_time_total / steps / 1e3:9.3f} ms  "
              f"{event.count / steps:8.1f} calls/step  {event.key}")
    if on_cuda:
        calls = Counter({e.key: e.count for e in averages if e.key in RUNTIME_CALLS})
        print("\nCUDA runtime calls per decode step: " + ", ".join(
            f"{name} {count / steps:.0f}" for name, count in calls.most_common()))
        device_us = sum(e.self_device_time_total for e in averages) / steps
        print(f"device busy per decode step: {device_us / 1e3:.3f} ms (sum of kernel times)")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_forward_arguments(parser, steps=8)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    forward = ForwardDecode.from_args(args)
    tokens_per_s = forward.measure()
    print(f"device={args.device} dtype={args.dtype} batch={args.batch}: "
          f"{args.batch / tokens_per_s * 1e3:.2f} ms per decode step unprofiled\n")
    python_profile(forward, args.steps, args.top)
    operator_profile(forward, args.steps, args.top, args.device.startswith("cuda"))


if __name__ == "__main__":
    main()
