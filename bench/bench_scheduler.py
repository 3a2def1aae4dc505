"""Scheduler bookkeeping cost per step, and descriptor size per decode row.

    python bench/bench_scheduler.py [--running 64 256] [--steps 200] [--partitions 1 4]
                                    [--no-prefix-caching] [--modes sync async]

Drives `Scheduler.schedule()` / `commit()` directly (no gRPC, no model) with N requests in decode
spread over P cache partitions (DP groups; N/P running in each), timing the planning and the commit
of one step separately, and measures the serialized
`StepRequest` bytes of a decode step (proto conversion included in its own figure). The block
groups are V4-Flash's (window 128, compressed, compressor rows with windows 8 and 128); prompts
share their first 256 tokens and, with prefix caching (the default), every request after the first
starts from that cached prefix, and decode steps publish the blocks they fill.

Mode `sync` plans a step after the previous one is committed (`--no-async-scheduling`); mode `async`
(the default serving mode) plans step N+1 while N is in flight, then commits N and asks for N+1's
late masks (`follow_masks`), as step_pipeline.py does: its rows follow a token still in flight.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.scheduler.kv_cache import BlockGroupSpec, KvCacheManager  # noqa: E402
from services.scheduler.requests import Request  # noqa: E402
from services.scheduler.limits import SchedulingLimits  # noqa: E402
from services.scheduler.prefix_cache import PrefixCachePolicy, root_hash  # noqa: E402
from services.scheduler.scheduler import Scheduler  # noqa: E402
from services.common.step_descriptors import RowResult, StepPlan, StepResult  # noqa: E402
from services.common.step_protos import plan_to_proto  # noqa: E402

VOCAB = 129_280
EOS = 1
BLOCK_SIZE = 32
PROMPT_LEN = 512
SHARED_LEN = 256


def make_scheduler(num_running: int, prefix_caching: bool, num_partitions: int) -> Scheduler:
    per_partition = num_running // num_partitions
    blocks = per_partition * 64
    groups = (BlockGroupSpec("window", blocks, 128), BlockGroupSpec("compressed", blocks, 0),
              BlockGroupSpec("csa_state", blocks, 8), BlockGroupSpec("hca_state", blocks, 128))
    limits = SchedulingLimits(max_model_len=16384, max_num_seqs=per_partition,
                              max_num_batched_tokens=1 << 20, long_prefill_token_threshold=0,
                              stall_timeout_s=5.0, eos_token_id=EOS)
    policy = PrefixCachePolicy(prefix_caching, root_hash("bench", "bfloat16", BLOCK_SIZE))
    partitions = {pid: groups for pid in range(num_partitions)}
    return Scheduler(limits, KvCacheManager(BLOCK_SIZE, partitions), prefix_policy=policy)


def start_all(scheduler: Scheduler, num_running: int, steps: int) -> StepPlan:
    """The first request alone (it fills the cache), then the others in one step."""
    for i in range(num_running):
        prompt = [2 + j % 1000 for j in range(SHARED_LEN)]
        prompt += [2 + (i + j) % 1000 for j in range(PROMPT_LEN - SHARED_LEN)]
        scheduler.add(Request(request_id=f"r{i}", prompt_token_ids=prompt,
                              max_tokens=steps + 10, logit_bias=(), ignore_eos=False,
                              constraint=None, emit=lambda event: None, arrival=i))
        if i == 0:
            first = scheduler.schedule()
            scheduler.commit(first, answer(first, 0))
    prefill = scheduler.schedule()
    scheduler.commit(prefill, answer(prefill, 0))
    return prefill


def answer(plan: StepPlan, step: int) -> StepResult:
    """A worker's answer: any non-EOS token per sampled row (the scheduler does not care which)."""
    return StepResult(plan.step_id,
                      [RowResult(row.seq_id, 2 + (row.seq_id * 7919 + step) % (VOCAB - 2))
                       for row in plan.rows if row.sample])


def bench(num_running: int, steps: int, prefix_caching: bool, num_partitions: int,
          overlapped: bool) -> dict[str, float]:
    scheduler = make_scheduler(num_running, prefix_caching, num_partitions)
    admit_started = time.perf_counter()
    prefill = start_all(scheduler, num_running, steps)
    admit_s = time.perf_counter() - admit_started
    schedule_s, commit_s, proto_s, row_bytes = [], [], [], []
    in_flight = scheduler.schedule() if overlapped else None
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        plan = scheduler.schedule()
        t1 = time.perf_counter()
        committed = in_flight if overlapped else plan
        result = answer(committed, step)
        t2 = time.perf_counter()
        scheduler.commit(committed, result)
        if overlapped:
            scheduler.follow_masks(plan)
        t3 = time.perf_counter()
        message = plan_to_proto(plan)
        size = message.ByteSize()
        t4 = time.perf_counter()
        assert len(plan.rows) == num_running and all(r.num_new_tokens == 1 for r in plan.rows)
        assert all(r.append_last_sampled == overlapped for r in plan.rows)
        in_flight = plan
        schedule_s.append(t1 - t0)
        commit_s.append(t3 - t2)
        proto_s.append(t4 - t3)
        row_bytes.append(size / len(plan.rows))
    scheduler.kv.check_integrity()
    return {"schedule_ms": 1e3 * statistics.median(schedule_s),
            "commit_ms": 1e3 * statistics.median(commit_s),
            "to_proto_ms": 1e3 * statistics.median(proto_s),
            "bytes_per_row": statistics.mean(row_bytes),
            "new_sequence_bytes": plan_to_proto(prefill).ByteSize() / (num_running - 1),
            "admit_ms": 1e3 * admit_s,
            "hit_rate": scheduler.counters.prefix_cache_hits_total
            / max(1, scheduler.counters.prefix_cache_queries_total)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false")
    parser.add_argument("--modes", nargs="+", choices=["sync", "async"], default=["sync", "async"])
    args = parser.parse_args()
    print(f"decode steps: {args.steps}, prompt {PROMPT_LEN} tokens ({SHARED_LEN} shared), block "
          f"size {BLOCK_SIZE}, V4 block groups, prefix caching "
          f"{'on' if args.prefix_caching else 'off'} (medians per step)")
    for mode in args.modes:
        for num_partitions in args.partitions:
            for num_running in args.running:
                report(mode, num_running, num_partitions,
                       bench(num_running, args.steps, args.prefix_caching, num_partitions,
                             overlapped=mode == "async"))


def report(mode: str, num_running: int, num_partitions: int, f: dict[str, float]) -> None:
    print(f"{mode:5s} partitions={num_partitions} running={num_running:4d}  bookkeeping "
          f"{f['schedule_ms'] + f['commit_ms']:.3f} ms: schedule "
          f"{f['schedule_ms']:.3f} ms  commit {f['commit_ms']:.3f} ms  to-proto+serialize "
          f"{f['to_proto_ms']:.3f} ms  per request "
          f"{1e3 * (f['schedule_ms'] + f['commit_ms']) / num_running:.1f} µs  decode row "
          f"{f['bytes_per_row']:.1f} B  NewSequence+prefill row {f['new_sequence_bytes']:.0f} B  "
          f"admitting all {f['admit_ms']:.1f} ms  hit rate {f['hit_rate']:.2f}")


if __name__ == "__main__":
    main()
