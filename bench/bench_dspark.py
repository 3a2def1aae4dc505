"""The DSpark drafter's cost beside a target decode step, on one CPU rank.

    python bench/bench_dspark.py [--batch 1 8] [--drafts 7] [--prompt-len 64] [--repeats 5]

On the tiny-dspark preset (tiny-a's target + three draft stages): the median wall time of one
target decode step over the batch, of one `propose` of K drafts per sequence, and of `observe`
for one committed token per sequence (what a step that commits one token costs the drafter).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.worker.model.drafter import DraftRequest  # noqa: E402
from services.worker.model.dspark import DSparkDrafter  # noqa: E402
from services.worker.model.runtime import (ModelRuntime, RuntimeConfig,  # noqa: E402
                                           SequenceChunk)
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint  # noqa: E402


def median_ms(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def measure(model_dir: Path, batch: int, prompt_len: int, drafts: int, repeats: int) -> str:
    runtime = ModelRuntime(RuntimeConfig(model_dir, torch.float32, "cpu", 32, batch * 4))
    drafter = DSparkDrafter(runtime.model)
    generator = torch.Generator().manual_seed(batch)
    tables = [runtime.cache.same_table_for_every_group(list(range(4 * i, 4 * i + 4)))
              for i in range(batch)]
    prompts = [torch.randint(2, 129_000, (prompt_len,), generator=generator).tolist()
               for _ in range(batch)]
    out = runtime.step([SequenceChunk(i, 0, p, tables[i], True) for i, p in enumerate(prompts)],
                       return_taps=drafter.tap_layer_ids)
    for i, taps in enumerate(out.taps):
        drafter.observe(i, 0, taps)
    decode = [SequenceChunk(i, prompt_len, [out.sampled[i]], tables[i], True)
              for i in range(batch)]
    step_ms = median_ms(lambda: runtime.step(decode, return_taps=drafter.tap_layer_ids), repeats)
    taps = runtime.step(decode, return_taps=drafter.tap_layer_ids).taps
    requests = [DraftRequest(i, out.sampled[i], prompt_len, drafts) for i in range(batch)]
    propose_ms = median_ms(lambda: drafter.propose(requests), repeats)
    observe_ms = median_ms(lambda: [drafter.observe(i, prompt_len, taps[i])
                                    for i in range(batch)], repeats)
    return (f"batch {batch:3d}: target decode step {step_ms:7.1f} ms   propose K={drafts} "
            f"{propose_ms:7.1f} ms   observe 1 token each {observe_ms:6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--drafts", type=int, default=7)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = write_tiny_checkpoint(scratch, preset="tiny-dspark")
        print(f"tiny-dspark, prompt {args.prompt_len}, float32, 1 thread, median of "
              f"{args.repeats}")
        for batch in args.batch:
            print(measure(model_dir, batch, args.prompt_len, args.drafts, args.repeats))


if __name__ == "__main__":
    main()
