"""Read-only snapshots of scheduler state for the debug RPCs (built inside the step loop task)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional

from services.scheduler.kv_cache import BlockTable, GroupUsage, KvCacheManager
from services.scheduler.prefix_cache import PrefixCacheStats
from services.scheduler.requests import Request, RequestPhase, SpecStats
from services.scheduler.limits import SchedulerCounters
from services.scheduler.scheduler import Scheduler


@dataclass(frozen=True)
class RequestSummary:
    request_id: str
    phase: RequestPhase
    partition_id: Optional[int]
    prompt_tokens: int
    computed_tokens: int
    output_tokens: int
    constrained: bool
    cached_tokens: int = 0
    spec: SpecStats = field(default_factory=SpecStats)


@dataclass(frozen=True)
class PartitionSnapshot:
    partition_id: int
    groups: list[GroupUsage]
    running_requests: int
    waiting_requests: int
    prefix_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)


@dataclass(frozen=True)
class SchedulerSnapshot:
    num_waiting: int
    num_running: int
    num_grammar_pending: int
    num_live_matchers: int
    num_constrained_running: int
    partitions: list[PartitionSnapshot]
    counters: SchedulerCounters
    grammar_cache_entries: int
    requests: list[RequestSummary] = field(default_factory=list)
    prefix_caching_enabled: bool = False
    num_live_draft_states: int = 0

    @staticmethod
    def build(scheduler: Optional[Scheduler], counters: SchedulerCounters,
              live: Iterable[Request], grammar: Optional[Any],
              include_requests: bool) -> "SchedulerSnapshot":
        live = list(live)
        running = scheduler.running if scheduler else []
        partitions = []
        if scheduler is not None:
            stats = scheduler.prefix.partition_stats
            partitions = [PartitionSnapshot(pid, scheduler.kv.usage(pid), len(queues.running),
                                            len(queues.waiting),
                                            replace(stats.get(pid, PrefixCacheStats())))
                          for pid, queues in scheduler.partitions.items()]
        return SchedulerSnapshot(
            num_waiting=len(scheduler.waiting) if scheduler else 0,
            num_running=len(running),
            num_grammar_pending=sum(1 for r in live if r.phase is RequestPhase.GRAMMAR_PENDING),
            num_live_matchers=grammar.live_matchers if grammar is not None else 0,
            num_constrained_running=sum(1 for r in running if r.constrained),
            partitions=partitions,
            counters=replace(counters, spec=replace(
                counters.spec, accepted_per_pos=list(counters.spec.accepted_per_pos),
                drafted_per_pos=list(counters.spec.drafted_per_pos),
                proposed_per_pos=list(counters.spec.proposed_per_pos))),
            grammar_cache_entries=grammar.cache_entries if grammar is not None else 0,
            requests=[summarize(r) for r in live] if include_requests else [],
            prefix_caching_enabled=scheduler is not None and scheduler.prefix.policy.enabled,
            num_live_draft_states=sum(1 for r in live if r.proposed_token_ids))


def summarize(request: Request) -> RequestSummary:
    return RequestSummary(request.request_id, request.phase, request.partition_id,
                          len(request.prompt_token_ids), request.num_computed_tokens,
                          len(request.output_token_ids), request.constrained,
                          request.num_cached_tokens if request.seq_id is not None else 0,
                          replace(request.spec))


@dataclass(frozen=True)
class RequestSnapshot:
    summary: RequestSummary
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    block_tables: dict[str, BlockTable]
    grammar_status: str
    max_tokens: int


def snapshot_request(request: Request, kv: Optional[KvCacheManager]) -> RequestSnapshot:
    has_sequence = kv is not None and request.seq_id is not None
    sequence = kv.sequence(request.seq_id) if has_sequence else None
    tables = ({name: BlockTable(list(t.block_ids), t.released_prefix)
               for name, t in sequence.tables.items()} if sequence else {})
    return RequestSnapshot(summarize(request), list(request.prompt_token_ids),
                           list(request.output_token_ids), tables, request.grammar_status,
                           request.max_tokens)
