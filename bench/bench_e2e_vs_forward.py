"""Decode throughput through all three services next to the bare model forward, and the cost of
constrained decoding per token, measured side by side in interleaved rounds.

    python bench/bench_e2e_vs_forward.py [--model DIR] [--batch 8] [--prompt-len 32] [--steps 32]
                                         [--rounds 5] [--async-scheduling both|on|off]

Every configuration runs once per round, in an order that rotates from round to round, so a slow
spell of a noisy machine lands on all of them alike; a ratio is formed within each round and the
medians over the rounds are printed with their range (min–max).
1. Bare forward: `ModelRuntime.step` alone — `--batch` sequences prefilled in one step, one warm-up
   decode step, then `--steps` timed decode steps of `--batch` single-token rows.
2. End to end: the same shape through frontend → scheduler → worker, one stack per scheduler mode
   asked (`both`: async scheduling on and off), each started with the project's own launcher
   (`dsv4serve stack`) before the first round: `--batch` concurrent streaming /v1/completions
   requests with token-id prompts of `--prompt-len`; decode tok/s counts tokens after each stream's
   first one, over the time from the last first-token to the first last-token.
3. Constrained vs unconstrained: mean inter-token latency of `--batch` concurrent streaming chat
   requests with a strict tool and `tool_choice: "auto"` (the grammar runs every step while the
   model writes free text) against the same request without tools, and against the same request
   with `tool_choice: "none"` (the same prompt, tools shown, no grammar: the grammar's cost alone).
Both sides use one intra-op thread (the worker's default on CPU) and the same device and dtype
(`--device cuda:0` starts the stack with `--backend cuda`). Default model: tiny-a.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, ContextManager, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.stack_load import (LocalStack, concurrent_streams, decode_tokens_per_s,  # noqa: E402
                              mean_inter_token_ms, token_prompts)
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk  # noqa: E402
from services.worker.model.tiny_checkpoint import default_model_dir  # noqa: E402

BLOCK_SIZE = 32
STRICT_TOOL = {"type": "function", "function": {
    "name": "lookup", "strict": True, "description": "Look something up",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"], "additionalProperties": False}}}
CHAT_VARIANTS = {"plain": {}, "tools none": {"tools": [STRICT_TOOL], "tool_choice": "none"},
                 "constrained": {"tools": [STRICT_TOOL], "tool_choice": "auto"}}


class ForwardDecode:
    """The bare runtime, kept across rounds: each `measure` prefills `batch` sequences afresh in
    the same blocks and times `steps` decode steps after a warm-up one."""

    def __init__(self, model_dir: Path, batch: int, prompt_len: int, steps: int,
                 dtype: torch.dtype, device: str) -> None:
        blocks_per_seq = math.ceil((prompt_len + steps + 1) / BLOCK_SIZE)
        self.runtime = ModelRuntime(RuntimeConfig(
            model_dir=model_dir, dtype=dtype, device=device, block_size=BLOCK_SIZE,
            num_blocks=batch * blocks_per_seq))
        vocab = self.runtime.config.vocab_size
        self.tables = [self.runtime.cache.same_table_for_every_group(
            list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))) for i in range(batch)]
        self.prompts = [[(97 * i + 13 * j + 5) % vocab for j in range(prompt_len)]
                        for i in range(batch)]
        self.model_dir, self.steps, self.device = model_dir, steps, device

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ForwardDecode":
        """From the flags of `add_forward_arguments`."""
        return cls(args.model or default_model_dir(), args.batch, args.prompt_len, args.steps,
                   getattr(torch, args.dtype), args.device)

    def measure(self, around: ContextManager = contextlib.nullcontext()) -> float:
        """Decode tok/s of one round; the timed steps run inside `around` (e.g. a profiler)."""
        last = self.runtime.step([SequenceChunk(i, 0, prompt, self.tables[i], sample=True)
                                  for i, prompt in enumerate(self.prompts)]).sampled
        position = len(self.prompts[0])
        last, position = self._decode_step(last, position), position + 1  # warm-up
        self._synchronize()
        with around:
            started = time.perf_counter()
            for _ in range(self.steps):
                last, position = self._decode_step(last, position), position + 1
            self._synchronize()
            return len(self.prompts) * self.steps / (time.perf_counter() - started)

    def _decode_step(self, last: list[Optional[int]], position: int) -> list[Optional[int]]:
        chunks = [SequenceChunk(i, position, [token], self.tables[i], sample=True)
                  for i, token in enumerate(last)]
        return self.runtime.step(chunks).sampled

    def _synchronize(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)


def stack_figures(stack: LocalStack, batch: int, prompt_len: int, steps: int,
                  round_index: int) -> dict[str, float]:
    """One round against one stack: decode tok/s of completions, then the inter-token latency of
    each chat variant (their order rotates with the round)."""
    completion = {"model": "bench", "max_tokens": steps + 1, "temperature": 0}
    streams = concurrent_streams(stack.base_url, "/v1/completions",
                                 [{**completion, "prompt": p} for p in token_prompts(batch, prompt_len)])
    figures = {"tok/s": decode_tokens_per_s(streams)}
    chat = {"model": "bench", "max_tokens": steps + 1, "temperature": 0,
            "messages": [{"role": "user", "content": "Say something."}]}
    for name, extra in rotated(list(CHAT_VARIANTS.items()), round_index):
        figures[name] = mean_inter_token_ms(concurrent_streams(
            stack.base_url, "/v1/chat/completions", [{**chat, **extra}] * batch))
    return figures


def rotated(items: list, round_index: int) -> list:
    shift = round_index % len(items)
    return items[shift:] + items[:shift]


def warm_up(stack: LocalStack) -> None:
    body = {"model": "bench", "max_tokens": 4, "temperature": 0, "prompt": [0, 5, 6]}
    concurrent_streams(stack.base_url, "/v1/completions", [body])
    chat = {"model": "bench", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi."}], **CHAT_VARIANTS["constrained"]}
    concurrent_streams(stack.base_url, "/v1/chat/completions", [chat])   # compiles the grammar


def run_rounds(rounds: int, measures: dict[str, Callable[[int], object]]) -> dict[str, list]:
    """Each measure once per round, in an order rotating by one every round."""
    results: dict[str, list] = {name: [] for name in measures}
    for round_index in range(rounds):
        for name, measure in rotated(list(measures.items()), round_index):
            results[name].append(measure(round_index))
        print(f"  round {round_index + 1}/{rounds} done", file=sys.stderr)
    return results


def spread(values: list[float], digits: int = 3) -> str:
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}–{max(values):.{digits}f}]")


def report(batch: int, forward: list[float], modes: dict[str, list[dict[str, float]]]) -> None:
    """Per-round ratios (median [min–max]), and the ratio of the best rounds (the least disturbed
    run of each configuration: the highest tok/s, the lowest inter-token latency)."""
    print(f"batch {batch}, {len(forward)} rounds; median [min–max] over rounds; best: the ratio of "
          f"each side's best round")
    print(f"  bare forward decode            {spread(forward, 1)} tok/s")
    for mode, rounds in modes.items():
        e2e = [r["tok/s"] for r in rounds]
        print(f"  async scheduling {mode:3s}: end-to-end decode {spread(e2e, 1)} tok/s; "
              f"÷ forward (same round) {spread([e / f for e, f in zip(e2e, forward)])}, "
              f"best {max(e2e) / max(forward):.3f}")
        itl = {name: [r[name] for r in rounds] for name in CHAT_VARIANTS}
        print(f"    inter-token ms: plain {spread(itl['plain'], 1)}, tools none "
              f"{spread(itl['tools none'], 1)}, constrained {spread(itl['constrained'], 1)}")
        for other in ("plain", "tools none"):
            ratio = [c / o for c, o in zip(itl["constrained"], itl[other])]
            print(f"    constrained ÷ {other} (same round) {spread(ratio)}, "
                  f"best {min(itl['constrained']) / min(itl[other]):.3f}")


def add_forward_arguments(parser: argparse.ArgumentParser, steps: int) -> None:
    """The bare forward's model, shape, device and dtype (`ForwardDecode.from_args`)."""
    parser.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: tiny-a)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=steps, help="timed decode steps per round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")


def stack_device_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The stack's worker on the bare forward's device and dtype (`cuda:N` → `--devices N`)."""
    flags = ("--dtype", args.dtype)
    if args.device.startswith("cuda"):
        flags += ("--backend", "cuda", "--devices", args.device.partition(":")[2] or "0")
    return flags


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_forward_arguments(parser, steps=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--torch-threads", type=int, default=1, help="as the worker's default on CPU")
    parser.add_argument("--async-scheduling", choices=("both", "on", "off"), default="both",
                        help="scheduler mode(s) of the end-to-end parts")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    forward = ForwardDecode.from_args(args)
    model_dir = forward.model_dir
    modes = [m for m in ("on", "off") if args.async_scheduling in (m, "both")]
    with contextlib.ExitStack() as stacks:
        measures: dict[str, Callable[[int], object]] = {"forward": lambda _: forward.measure()}
        for mode in modes:
            flag = "--async-scheduling" if mode == "on" else "--no-async-scheduling"
            stack = stacks.enter_context(LocalStack(model_dir, (
                "--max-num-seqs", str(max(8, args.batch)), flag, *stack_device_flags(args))))
            warm_up(stack)
            measures[mode] = (lambda stack: lambda i: stack_figures(
                stack, args.batch, args.prompt_len, args.steps, i))(stack)
        results = run_rounds(args.rounds, measures)
    print(f"model={model_dir.name} dtype={args.dtype} device={args.device} steps={args.steps} "
          f"prompt={args.prompt_len}")
    report(args.batch, results["forward"], {mode: results[mode] for mode in modes})


if __name__ == "__main__":
    main()
