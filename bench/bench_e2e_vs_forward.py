"""Decode throughput through all three services next to the bare model forward, and the cost of
constrained decoding per token.

    python bench/bench_e2e_vs_forward.py [--model DIR] [--batch 8] [--prompt-len 32] [--steps 16]
                                         [--async-scheduling both|on|off]

1. Bare forward: `ModelRuntime.step` alone — `--batch` sequences prefilled in one step, one warm-up
   decode step, then `--steps` timed decode steps of `--batch` single-token rows.
2. End to end: the same shape through frontend → scheduler → worker, started with the project's own
   launcher (`dsv4serve stack`): `--batch` concurrent streaming /v1/completions requests with
   token-id prompts of `--prompt-len`; decode tok/s counts tokens after each stream's first one,
   over the time from the first first-token to the last token.
3. Constrained vs unconstrained: mean inter-token latency of streaming chat requests at batch 1 and
   `--batch`, with a strict tool and `tool_choice: "auto"` (the grammar runs every step while the
   model writes free text) against the same request without tools, and against the same request
   with `tool_choice: "none"` (the same prompt, tools shown, no grammar: the grammar's cost alone).
Both sides use one intra-op thread (the worker's default on CPU). Default model: tiny-a. Parts 2
and 3 run once per scheduler mode asked (`both`: async scheduling on, then off, side by side), each
end-to-end figure with its ratio to the bare forward.
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
                                         block_size=BLOCK_SIZE, num_blocks=batch * blocks_per_seq))
    vocab = runtime.config.vocab_size
    tables = [runtime.cache.same_table_for_every_group(
        list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))) for i in range(batch)]
    prompts = [[(97 * i + 13 * j + 5) % vocab for j in range(prompt_len)] for i in range(batch)]
    last = runtime.step([SequenceChunk(i, 0, prompts[i], tables[i], sample=True)
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
                 tables: list[dict[str, list[int]]]) -> list[Optional[int]]:
    chunks = [SequenceChunk(i, position, [token], tables[i], sample=True)
              for i, token in enumerate(last)]
    return runtime.step(chunks).sampled


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


STRICT_TOOL = {"type": "function", "function": {
    "name": "lookup", "strict": True, "description": "Look something up",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"], "additionalProperties": False}}}


def measure_end_to_end(model_dir: Path, batch: int, prompt_len: int, steps: int,
                       async_scheduling: bool, forward: DecodeFigures) -> None:
    from bench.stack_load import (LocalStack, concurrent_streams, decode_tokens_per_s,
                                  mean_inter_token_ms, token_prompts)

    mode = "--async-scheduling" if async_scheduling else "--no-async-scheduling"
    with LocalStack(model_dir, ("--max-num-seqs", str(max(8, batch)), mode)) as stack:
        completion = {"model": "bench", "max_tokens": steps + 1, "temperature": 0}
        concurrent_streams(stack.base_url, "/v1/completions", [{**completion, "prompt": [0, 5, 6]}])  # warm-up
        streams = concurrent_streams(stack.base_url, "/v1/completions",
                                     [{**completion, "prompt": p} for p in token_prompts(batch, prompt_len)])
        tokens_per_s = decode_tokens_per_s(streams)
        print(f"end-to-end decode model={model_dir.name} batch={batch} {mode}: {tokens_per_s:.1f} "
              f"tok/s, {tokens_per_s / forward.tokens_per_s:.3f}x the bare forward")
        for size in (1, batch):
            chat = {"model": "bench", "max_tokens": steps + 1, "temperature": 0,
                    "messages": [{"role": "user", "content": "Say something."}]}
            plain = concurrent_streams(stack.base_url, "/v1/chat/completions", [chat] * size)
            tools_shown = concurrent_streams(stack.base_url, "/v1/chat/completions",
                                             [{**chat, "tools": [STRICT_TOOL], "tool_choice": "none"}] * size)
            constrained = concurrent_streams(stack.base_url, "/v1/chat/completions",
                                             [{**chat, "tools": [STRICT_TOOL], "tool_choice": "auto"}] * size)
            a, b = mean_inter_token_ms(plain), mean_inter_token_ms(constrained)
            same_prompt = mean_inter_token_ms(tools_shown)
            print(f"inter-token latency batch={size} {mode}: unconstrained {a:.1f} ms, constrained (auto, strict "
                  f"tool) {b:.1f} ms, ratio {b / a:.3f}; unconstrained with the same prompt (tool_choice "
                  f"none) {same_prompt:.1f} ms, ratio {b / same_prompt:.3f}")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: tiny-a)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--torch-threads", type=int, default=1, help="as the worker's default on CPU")
    parser.add_argument("--skip-end-to-end", action="store_true")
    parser.add_argument("--async-scheduling", choices=("both", "on", "off"), default="both",
                        help="scheduler mode(s) of the end-to-end parts")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    model_dir = args.model or default_model_dir()
    figures = measure_forward_decode(model_dir, args.batch, args.prompt_len, args.steps,
                                     getattr(torch, args.dtype), args.device)
    print(f"forward decode  model={model_dir.name} batch={figures.batch} dtype={args.dtype} "
          f"device={args.device}: {figures.tokens_per_s:.1f} tok/s "
          f"({figures.ms_per_step:.1f} ms/step over {figures.steps} steps)")
    if not args.skip_end_to_end:
        for mode in ("on", "off"):
            if args.async_scheduling in (mode, "both"):
                measure_end_to_end(model_dir, args.batch, args.prompt_len, args.steps, mode == "on",
                                   figures)


if __name__ == "__main__":
    main()
