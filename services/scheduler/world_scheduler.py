"""A Scheduler for the world the workers described: its cache partitions, limits and prefix cache
policy, from the scheduler's config and the handshake."""
from __future__ import annotations

from services.common.config import SchedulerConfig
from services.scheduler.kv_cache import KvCacheManager
from services.scheduler.limits import SchedulerCounters, SchedulingLimits
from services.scheduler.memory_pressure import ConstrainedPreemption
from services.scheduler.prefix_cache import PrefixCachePolicy, root_hash
from services.scheduler.scheduler import Scheduler
from services.scheduler.speculation import prefix_min_tokens, spec_policy
from services.scheduler.worker_description import WorkerDescription


def scheduler_for_world(config: SchedulerConfig, description: WorkerDescription,
                        counters: SchedulerCounters) -> Scheduler:
    kv = KvCacheManager(description.block_size,
                        {pid: description.block_groups for pid in description.partition_ids})
    limits = SchedulingLimits(
        max_model_len=config.max_model_len,
        max_num_seqs=min(config.max_num_seqs, description.max_num_seqs or config.max_num_seqs),
        max_num_batched_tokens=min(config.max_num_batched_tokens,
                                   description.max_num_batched_tokens),
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        stall_timeout_s=config.stall_timeout_s, eos_token_id=description.eos_token_id,
        constrained_preemption=ConstrainedPreemption(config.preempt_constrained),
        speculation=spec_policy(config.speculative))
    prefix_policy = PrefixCachePolicy(
        enabled=config.enable_prefix_caching,
        root=root_hash(description.model_fingerprint, description.compute_dtype,
                       description.block_size),
        min_tokens_to_compute=prefix_min_tokens(config))
    return Scheduler(limits, kv, counters, prefix_policy=prefix_policy)
