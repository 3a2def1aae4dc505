"""Drive `Scheduler` directly with synthetic requests and a simulated worker."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from services.common.step_protos import plan_to_proto, result_from_proto
from services.scheduler.kv_cache import BlockGroupSpec, KvCacheManager
from services.scheduler.prefix_cache import PrefixCachePolicy, root_hash
from services.scheduler.requests import ConstraintSpec, Request, RequestEvent, TokensEvent
from services.scheduler.limits import SchedulingLimits
from services.scheduler.scheduler import Scheduler
from services.common.step_descriptors import RowResult, StepPlan, StepResult
from tests.scheduler.fake_worker import (EOS_TOKEN_ID, FINGERPRINT, FakeWorker, FakeWorkerSpec,
                                         next_token)

BLOCK_SIZE = 4


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_scheduler(*, num_blocks: int = 256, num_window_blocks: int = 64, sliding_window: int = 8,
                   partitions: tuple[int, ...] = (0,), clock: Optional[FakeClock] = None,
                   **limits: Any) -> Scheduler:
    groups = (BlockGroupSpec("window", num_window_blocks, sliding_window),
              BlockGroupSpec("compressed", num_blocks, 0))
    kv = KvCacheManager(BLOCK_SIZE, {pid: groups for pid in partitions})
    defaults = dict(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=8192,
                    long_prefill_token_threshold=0, stall_timeout_s=5.0, eos_token_id=EOS_TOKEN_ID)
    defaults.update(limits)
    return Scheduler(SchedulingLimits(**defaults), kv, clock=clock or FakeClock())


def make_cached_scheduler(spec: FakeWorkerSpec = FakeWorkerSpec(), *, prefix_caching: bool = True,
                          min_tokens_to_compute: int = 1, clock: Optional[FakeClock] = None,
                          **limits: Any) -> tuple[Scheduler, FakeWorker]:
    """A scheduler with the fake worker's block groups, and that worker, which checks every step
    (including what each block it reads holds): drive both with `run_checked_step`."""
    worker = FakeWorker(spec)
    groups = tuple(BlockGroupSpec(name, spec.num_blocks if name == "compressed"
                                  else spec.num_window_blocks, window)
                   for name, window in worker.windows.items())
    kv = KvCacheManager(spec.block_size, {pid: groups for pid in spec.partition_ids})
    defaults = dict(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=8192,
                    long_prefill_token_threshold=0, stall_timeout_s=5.0, eos_token_id=EOS_TOKEN_ID)
    defaults.update(limits)
    policy = PrefixCachePolicy(prefix_caching, root_hash(FINGERPRINT, "float32", spec.block_size),
                               min_tokens_to_compute)
    return Scheduler(SchedulingLimits(**defaults), kv, clock=clock or FakeClock(),
                     prefix_policy=policy), worker


def run_checked_step(scheduler: Scheduler, worker: FakeWorker) -> Optional[StepPlan]:
    """One step through the checking fake worker; fails the test on any violation."""
    plan = scheduler.schedule()
    if plan is not None:
        response = worker.run_step(plan_to_proto(plan))
        assert not worker.violations, worker.violations
        scheduler.commit(plan, result_from_proto(response))
        scheduler.kv.check_integrity()
    return plan


def run_checked_until_idle(scheduler: Scheduler, worker: FakeWorker,
                           max_steps: int = 20_000) -> list[StepPlan]:
    plans = []
    for _ in range(max_steps):
        plan = run_checked_step(scheduler, worker)
        if plan is None:
            return plans
        plans.append(plan)
    raise AssertionError(f"still busy after {max_steps} steps")


@dataclass
class Recorder:
    events: list[RequestEvent] = field(default_factory=list)

    def __call__(self, event: RequestEvent) -> None:
        self.events.append(event)

    @property
    def streamed(self) -> list[int]:
        return [t for e in self.events if isinstance(e, TokensEvent) for t in e.token_ids]


_arrivals = iter(range(1_000_000))


def make_request(request_id: str, prompt: list[int], max_tokens: int, *,
                 constraint: Optional[ConstraintSpec] = None, matcher: Any = None,
                 ignore_eos: bool = False) -> tuple[Request, Recorder]:
    recorder = Recorder()
    request = Request(request_id=request_id, prompt_token_ids=list(prompt), max_tokens=max_tokens,
                      logit_bias=(), ignore_eos=ignore_eos, constraint=constraint, emit=recorder,
                      arrival=next(_arrivals), matcher=matcher, correlation_id=request_id)
    return request, recorder


def simulate(scheduler: Scheduler, plan: StepPlan, eos_after: Optional[int] = None) -> StepResult:
    """What a correct worker answers: next_token of the sequence's tokens, masks obeyed."""
    results = []
    for row in plan.rows:
        if not row.sample:
            continue
        request = scheduler.request_for_seq(row.seq_id)
        tokens = request.tokens_in_range(0, request.num_tokens)
        eos_now = eos_after is not None and tokens[-1] == eos_after
        token = EOS_TOKEN_ID if eos_now else next_token(tokens)
        if row.mask is not None and token not in row.mask.allowed_token_ids:
            token = min(row.mask.allowed_token_ids)
        results.append(RowResult(row.seq_id, token))
    return StepResult(plan.step_id, results)


def run_step(scheduler: Scheduler, eos_after: Optional[int] = None) -> Optional[StepPlan]:
    plan = scheduler.schedule()
    if plan is not None:
        scheduler.commit(plan, simulate(scheduler, plan, eos_after))
        scheduler.kv.check_integrity()
    return plan


def run_until_idle(scheduler: Scheduler, max_steps: int = 10_000) -> list[StepPlan]:
    plans = []
    for _ in range(max_steps):
        plan = run_step(scheduler)
        if plan is None:
            return plans
        plans.append(plan)
    raise AssertionError(f"still busy after {max_steps} steps")


def reference_output(prompt: list[int], num_tokens: int) -> list[int]:
    """What the fake model generates for `prompt` alone (no EOS in the fake model's range)."""
    tokens = list(prompt)
    for _ in range(num_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]
