"""Decode throughput of the bare model runtime, the baseline the served stack is compared against.

    python bench/bench_e2e_vs_forward.py [--model DIR] [--batch 8] [--prompt-len 32] [--steps 16]

Measures `ModelRuntime.step` alone: `--batch` sequences are prefilled in one step, one decode step
warms up, then `--steps` decode steps of `--batch` single-token rows are timed. The end-to-end side
(the same decode through frontend → scheduler → worker) is added by the integrator next to it, so
both figures come from one run on one machine. Default model: the tiny-a checkpoint.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk  # noqa: E402
from services.worker.model.tiny_checkpoint import default_model_dir  # noqa: E402

BLOCK_SIZE = 32


@dataclass(frozen=True)
class DecodeFigures:
    batch: int
    steps: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.steps / self.seconds

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.seconds / self.steps


def measure_forward_decode(model_dir: Path, batch: int, prompt_len: int, steps: int,
                           dtype: torch.dtype, device: str) -> DecodeFigures:
    blocks_per_seq = math.ceil((prompt_len + steps + 1) / BLOCK_SIZE)
    runtime = ModelRuntime(RuntimeConfig(model_dir=model_dir, dtype=dtype, device=device,
                                         block_size=BLOCK_SIZE, num_blocks=batch * blocks_per_seq,
                                         num_window_blocks=batch * blocks_per_seq))
    vocab = runtime.config.vocab_size
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]
    prompts = [[(97 * i + 13 * j + 5) % vocab for j in range(prompt_len)] for i in range(batch)]
    last = runtime.step([SequenceChunk(i, 0, prompts[i], tables[i], tables[i], sample=True)
                         for i in range(batch)]).sampled
    position = prompt_len
    last, position = _decode_step(runtime, last, position, tables), position + 1  # warm-up
    _synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        last, position = _decode_step(runtime, last, position, tables), position + 1
    _synchronize(device)
    return DecodeFigures(batch=batch, steps=steps, seconds=time.perf_counter() - started)


def _decode_step(runtime: ModelRuntime, last: list[Optional[int]], position: int,
                 tables: list[list[int]]) -> list[Optional[int]]:
    chunks = [SequenceChunk(i, position, [token], tables[i], tables[i], sample=True)
              for i, token in enumerate(last)]
    return runtime.step(chunks).sampled


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: tiny-a)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args(argv)
    model_dir = args.model or default_model_dir()
    figures = measure_forward_decode(model_dir, args.batch, args.prompt_len, args.steps,
                                     getattr(torch, args.dtype), args.device)
    print(f"forward decode  model={model_dir.name} batch={figures.batch} dtype={args.dtype} "
          f"device={args.device}: {figures.tokens_per_s:.1f} tok/s "
          f"({figures.ms_per_step:.1f} ms/step over {figures.steps} steps)")


if __name__ == "__main__":
    main()
