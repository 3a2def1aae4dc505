"""Conversions between scheduler.proto messages and the scheduler's dataclasses."""
from __future__ import annotations

from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from services.scheduler.errors import ErrorKind, SchedulerError
from services.scheduler.requests import (AdmittedEvent, ConstraintSpec, FinishedEvent, FinishReason,
                                         GenerateParams, RequestEvent, RequestPhase, TokensEvent)
from services.scheduler.state_view import (PartitionSnapshot, RequestSnapshot, RequestSummary,
                                           SchedulerSnapshot)
from services.scheduler.worker_connection import WorkerStatusView

_CONSTRAINT_KINDS = {
    pb.CONSTRAINT_TYPE_STRUCTURAL_TAG: "structural_tag",
    pb.CONSTRAINT_TYPE_JSON_SCHEMA: "json_schema",
    pb.CONSTRAINT_TYPE_JSON_OBJECT: "json_object",
}
_FINISH_REASONS = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
}
_PHASES = {
    RequestPhase.GRAMMAR_PENDING: pb.REQUEST_PHASE_GRAMMAR_PENDING,
    RequestPhase.WAITING: pb.REQUEST_PHASE_WAITING,
    RequestPhase.RUNNING: pb.REQUEST_PHASE_RUNNING,
    RequestPhase.FINISHED: pb.REQUEST_PHASE_FINISHED,
}


def params_from_proto(request: pb.GenerateRequest) -> GenerateParams:
    """Raises SchedulerError(INVALID_ARGUMENT) for a missing id or an unknown constraint type."""
    if not request.request_id:
        raise SchedulerError(ErrorKind.INVALID_ARGUMENT, "request_id is required")
    sampling = request.sampling
    return GenerateParams(
        request_id=request.request_id,
        prompt_token_ids=tuple(request.prompt_token_ids),
        max_tokens=sampling.max_tokens if sampling.HasField("max_tokens") else None,
        logit_bias=tuple((b.token_id, b.bias) for b in sampling.logit_bias),
        ignore_eos=sampling.ignore_eos,
        constraint=_constraint_from_proto(request.constraint))


def _constraint_from_proto(constraint: pb.Constraint) -> ConstraintSpec | None:
    if constraint.type == pb.CONSTRAINT_TYPE_NONE:
        return None
    kind = _CONSTRAINT_KINDS.get(constraint.type)
    if kind is None:
        raise SchedulerError(ErrorKind.INVALID_ARGUMENT,
                             f"unknown constraint type {constraint.type}")
    return ConstraintSpec(kind, constraint.spec)


def event_to_proto(event: RequestEvent) -> pb.GenerateResponse:
    if isinstance(event, AdmittedEvent):
        return pb.GenerateResponse(admitted=pb.Admitted(
            prompt_tokens=event.prompt_tokens, max_tokens=event.max_tokens,
            constrained=event.constrained, max_tokens_capped=event.max_tokens_capped))
    if isinstance(event, TokensEvent):
        return pb.GenerateResponse(tokens=pb.TokenDelta(token_ids=event.token_ids))
    if isinstance(event, FinishedEvent):
        return pb.GenerateResponse(finished=pb.Finished(
            reason=_FINISH_REASONS[event.reason], prompt_tokens=event.prompt_tokens,
            completion_tokens=event.completion_tokens, hit_max_model_len=event.hit_max_model_len))
    raise TypeError(f"no GenerateResponse for {event!r}")


def worker_status_to_proto(status: WorkerStatusView) -> pb.WorkerStatus:
    return pb.WorkerStatus(address=status.address, connected=status.connected, error=status.error,
                           last_ok_age_ms=status.last_ok_age_ms)


def summary_to_proto(summary: RequestSummary) -> pb.RequestSummary:
    return pb.RequestSummary(
        request_id=summary.request_id, phase=_PHASES[summary.phase],
        partition_id=summary.partition_id or 0, prompt_tokens=summary.prompt_tokens,
        computed_tokens=summary.computed_tokens, output_tokens=summary.output_tokens,
        constrained=summary.constrained, cached_tokens=summary.cached_tokens,
        spec_verify_rows=summary.spec.verify_rows, spec_drafted_tokens=summary.spec.drafted_tokens,
        spec_accepted_tokens=summary.spec.accepted_tokens,
        spec_forced_tokens=summary.spec.forced_tokens)


def state_to_proto(snapshot: SchedulerSnapshot,
                   workers: list[WorkerStatusView]) -> pb.GetSchedulerStateResponse:
    counters = snapshot.counters
    return pb.GetSchedulerStateResponse(
        num_waiting=snapshot.num_waiting, num_running=snapshot.num_running,
        num_grammar_pending=snapshot.num_grammar_pending,
        num_live_matchers=snapshot.num_live_matchers,
        num_constrained_running=snapshot.num_constrained_running,
        partitions=[partition_to_proto(p) for p in snapshot.partitions],
        workers=[worker_status_to_proto(w) for w in workers],
        steps_total=counters.steps_total, preemptions_total=counters.preemptions_total,
        stall_rejections_total=counters.stall_rejections_total,
        grammar_cache_entries=snapshot.grammar_cache_entries,
        requests=[summary_to_proto(r) for r in snapshot.requests],
        prompt_tokens_total=counters.prompt_tokens_total,
        generation_tokens_total=counters.generation_tokens_total,
        prefix_caching_enabled=snapshot.prefix_caching_enabled,
        prefix_cache_queries_total=counters.prefix_cache_queries_total,
        prefix_cache_hits_total=counters.prefix_cache_hits_total,
        constrained_preemptions_total=counters.constrained_preemptions_total,
        spec_decode_num_drafts=counters.spec.num_drafts,
        spec_decode_num_draft_tokens=counters.spec.num_draft_tokens,
        spec_decode_num_accepted_tokens=counters.spec.num_accepted_tokens,
        spec_decode_num_accepted_tokens_per_pos=counters.spec.accepted_per_pos,
        spec_decode_num_forced_tokens=counters.spec.num_forced_tokens,
        spec_decode_num_draft_tokens_per_pos=counters.spec.drafted_per_pos,
        spec_decode_num_accepted_proposals_per_pos=counters.spec.proposed_per_pos,
        spec_decode_num_proposal_sets=counters.spec.num_proposal_sets,
        num_live_draft_states=snapshot.num_live_draft_states,
        step_seconds_total=counters.step_seconds_total,
        worker_forward_seconds_total=counters.worker_forward_seconds_total)


def partition_to_proto(p: PartitionSnapshot) -> pb.PartitionUsage:
    return pb.PartitionUsage(
        partition_id=p.partition_id, running_requests=p.running_requests,
        waiting_requests=p.waiting_requests,
        groups=[pb.BlockGroupUsage(group=g.group, total_blocks=g.total_blocks,
                                   free_blocks=g.free_blocks, used_blocks=g.used_blocks,
                                   cached_blocks=g.cached_blocks) for g in p.groups],
        prefix_cache_queries=p.prefix_cache.queries, prefix_cache_hits=p.prefix_cache.hits,
        prefix_cache_hit_rate=p.prefix_cache.hit_rate)


def request_state_to_proto(snapshot: RequestSnapshot) -> pb.GetRequestStateResponse:
    return pb.GetRequestStateResponse(
        summary=summary_to_proto(snapshot.summary),
        prompt_token_ids=snapshot.prompt_token_ids, output_token_ids=snapshot.output_token_ids,
        block_tables=[pb.BlockTable(group=name, block_ids=t.block_ids,
                                    released_prefix=t.released_prefix)
                      for name, t in snapshot.block_tables.items()],
        grammar_status=snapshot.grammar_status, max_tokens=snapshot.max_tokens)
