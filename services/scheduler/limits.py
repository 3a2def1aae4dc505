"""The scheduler's limits (from the config and the workers' handshake) and its counters."""
from __future__ import annotations

from dataclasses import dataclass, field

from services.scheduler.memory_pressure import ConstrainedPreemption
from services.scheduler.speculation import SpecCounters, SpecPolicy


@dataclass(frozen=True)
class SchedulingLimits:
    max_model_len: int
    max_num_seqs: int            # per partition
    max_num_batched_tokens: int  # per partition
    long_prefill_token_threshold: int
    stall_timeout_s: float
    eos_token_id: int
    constrained_preemption: ConstrainedPreemption = ConstrainedPreemption.WAIT
    speculation: SpecPolicy = SpecPolicy()


@dataclass
class SchedulerCounters:
    steps_total: int = 0
    preemptions_total: int = 0
    constrained_preemptions_total: int = 0  # matcher given up, replayed on resume
    stall_rejections_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_cache_queries_total: int = 0  # tokens looked up when requests started
    prefix_cache_hits_total: int = 0     # tokens of those served from the cache
    step_seconds_total: float = 0.0            # written by StepPipeline (see scheduler.proto)
    worker_forward_seconds_total: float = 0.0  # written by StepPipeline
    spec: SpecCounters = field(default_factory=SpecCounters)
