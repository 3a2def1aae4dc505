"""Scheduler bookkeeping cost per step, and descriptor size per decode row.

    python bench/bench_scheduler.py [--running 64 256] [--steps 200]

Drives `Scheduler.schedule()` / `commit()` directly (no gRPC, no model) with N requests in decode,
timing the planning and the commit of one step separately, and measures the serialized
`StepRequest` bytes of a decode step (proto conversion included in its own figure).
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
from services.scheduler.scheduler import Scheduler  # noqa: E402
from services.common.step_descriptors import RowResult, StepPlan, StepResult  # noqa: E402
from services.common.step_protos import plan_to_proto  # noqa: E402

VOCAB = 129_280
EOS = 1
BLOCK_SIZE = 32
PROMPT_LEN = 512


def make_scheduler(num_running: int) -> Scheduler:
    groups = (BlockGroupSpec("window", num_running * (PROMPT_LEN // BLOCK_SIZE + 1), 128),
              BlockGroupSpec("compressed", num_running * 64, 0))
    limits = SchedulingLimits(max_model_len=16384, max_num_seqs=num_running,
                              max_num_batched_tokens=1 << 20, long_prefill_token_threshold=0,
                              stall_timeout_s=5.0, eos_token_id=EOS)
    return Scheduler(limits, KvCacheManager(BLOCK_SIZE, {0: groups}))


def answer(plan: StepPlan, step: int) -> StepResult:
    """A worker's answer: any non-EOS token per sampled row (the scheduler does not care which)."""
    return StepResult(plan.step_id,
                      [RowResult(row.seq_id, 2 + (row.seq_id * 7919 + step) % (VOCAB - 2))
                       for row in plan.rows if row.sample])


def bench(num_running: int, steps: int) -> dict[str, float]:
    scheduler = make_scheduler(num_running)
    for i in range(num_running):
        prompt = [2 + (i + j) % 1000 for j in range(PROMPT_LEN)]
        scheduler.add(Request(request_id=f"r{i}", prompt_token_ids=prompt,
                              max_tokens=steps + 10, logit_bias=(), ignore_eos=False,
                              constraint=None, emit=lambda event: None, arrival=i))
    prefill = scheduler.schedule()
    scheduler.commit(prefill, answer(prefill, 0))
    schedule_s, commit_s, proto_s, row_bytes = [], [], [], []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        plan = scheduler.schedule()
        t1 = time.perf_counter()
        result = answer(plan, step)
        t2 = time.perf_counter()
        scheduler.commit(plan, result)
        t3 = time.perf_counter()
        message = plan_to_proto(plan)
        size = message.ByteSize()
        t4 = time.perf_counter()
        assert len(plan.rows) == num_running and all(r.num_new_tokens == 1 for r in plan.rows)
        schedule_s.append(t1 - t0)
        commit_s.append(t3 - t2)
        proto_s.append(t4 - t3)
        row_bytes.append(size / len(plan.rows))
    scheduler.kv.check_integrity()
    return {"schedule_ms": 1e3 * statistics.median(schedule_s),
            "commit_ms": 1e3 * statistics.median(commit_s),
            "to_proto_ms": 1e3 * statistics.median(proto_s),
            "bytes_per_row": statistics.mean(row_bytes),
            "new_sequence_bytes": plan_to_proto(prefill).ByteSize() / num_running}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print(f"decode steps: {args.steps}, prompt {PROMPT_LEN} tokens, block size {BLOCK_SIZE}, "
          f"window 128 (medians per step)")
    for num_running in args.running:
        f = bench(num_running, args.steps)
        print(f"running={num_running:4d}  schedule {f['schedule_ms']:.3f} ms  commit "
              f"{f['commit_ms']:.3f} ms  to-proto+serialize {f['to_proto_ms']:.3f} ms  "
              f"per request {1e3 * (f['schedule_ms'] + f['commit_ms']) / num_running:.1f} µs  "
              f"decode row {f['bytes_per_row']:.1f} B  NewSequence+prefill row "
              f"{f['new_sequence_bytes']:.0f} B")


if __name__ == "__main__":
    main()
