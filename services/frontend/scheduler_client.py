"""Typed wrapper of the Scheduler gRPC stub: with generation_stream.py, the only frontend code that
sees scheduler protos.

Everything it returns is a plain dataclass (scheduler_values.py). gRPC failures become
`SchedulerError` (scheduler_errors.py) carrying the HTTP status the gateway should answer with.
"""
from __future__ import annotations

from typing import Optional

import grpc

from services.common import correlation
from services.common.config import TlsConfig
from services.common.grpc_channels import aio_channel
from services.common.pb.dsv4serve.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.frontend.generation_stream import GenerationStream, generate_request_to_proto
from services.frontend.scheduler_errors import SchedulerError
from services.frontend.scheduler_values import (GenerationSpec, ModelInfo, PartitionStats,
                                                Readiness, SchedulerSnapshot, WorkerReadiness)


class SchedulerClient:
    """Owns the channel to the scheduler. Create and close it inside the serving event loop.

    `request_timeout_s` becomes the deadline of every Generate call: gRPC carries it to the
    scheduler, which cancels (and so frees) the request when it passes.
    """

    def __init__(self, address: str, tls: TlsConfig = TlsConfig(),
                 request_timeout_s: Optional[float] = None) -> None:
        self._channel = aio_channel(address, tls)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._request_timeout_s = request_timeout_s

    async def close(self) -> None:
        await self._channel.close()

    def generate(self, spec: GenerationSpec, correlation_id: str = "") -> GenerationStream:
        metadata = ((correlation.METADATA_KEY, correlation_id),) if correlation_id else None
        call = self._stub.Generate(generate_request_to_proto(spec), metadata=metadata,
                                   timeout=self._request_timeout_s)
        return GenerationStream(call, self._request_timeout_s)

    async def abort(self, request_id: str, timeout_s: float = 5.0) -> bool:
        response = await self._unary(self._stub.Abort, scheduler_pb2.AbortRequest(request_id=request_id),
                                     timeout_s)
        return response.found

    async def get_model_info(self, timeout_s: float = 5.0) -> ModelInfo:
        r = await self._unary(self._stub.GetModelInfo, scheduler_pb2.GetModelInfoRequest(), timeout_s)
        return ModelInfo(r.served_model_name, r.max_model_len, r.vocab_size, r.eos_token_id,
                         r.block_size, r.model_fingerprint, r.constrained_decoding_available)

    async def check_ready(self, timeout_s: float) -> Readiness:
        r = await self._unary(self._stub.CheckReady, scheduler_pb2.CheckReadyRequest(), timeout_s)
        workers = tuple(WorkerReadiness(w.address, w.connected, w.error, w.last_ok_age_ms)
                        for w in r.workers)
        return Readiness(r.ready, r.reason, workers)

    async def get_scheduler_state(self, timeout_s: float) -> SchedulerSnapshot:
        r = await self._unary(self._stub.GetSchedulerState, scheduler_pb2.GetSchedulerStateRequest(),
                              timeout_s)
        groups = [g for p in r.partitions for g in p.groups]
        return SchedulerSnapshot(
            num_waiting=r.num_waiting, num_running=r.num_running,
            num_grammar_pending=r.num_grammar_pending, num_live_matchers=r.num_live_matchers,
            num_constrained_running=r.num_constrained_running,
            total_blocks=sum(g.total_blocks for g in groups),
            used_blocks=sum(g.used_blocks for g in groups),
            steps_total=r.steps_total, preemptions_total=r.preemptions_total,
            stall_rejections_total=r.stall_rejections_total,
            grammar_cache_entries=r.grammar_cache_entries,
            prompt_tokens_total=r.prompt_tokens_total,
            generation_tokens_total=r.generation_tokens_total,
            partitions=tuple(PartitionStats(
                p.partition_id, p.running_requests, p.waiting_requests,
                sum(g.total_blocks for g in p.groups), sum(g.used_blocks for g in p.groups),
                sum(g.cached_blocks for g in p.groups), p.prefix_cache_queries,
                p.prefix_cache_hits) for p in r.partitions),
            prefix_cache_queries_total=r.prefix_cache_queries_total,
            prefix_cache_hits_total=r.prefix_cache_hits_total,
            constrained_preemptions_total=r.constrained_preemptions_total,
            spec_decode_num_drafts=r.spec_decode_num_drafts,
            spec_decode_num_draft_tokens=r.spec_decode_num_draft_tokens,
            spec_decode_num_accepted_tokens=r.spec_decode_num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=tuple(
                r.spec_decode_num_accepted_tokens_per_pos),
            spec_decode_num_forced_tokens=r.spec_decode_num_forced_tokens,
            spec_decode_num_draft_tokens_per_pos=tuple(r.spec_decode_num_draft_tokens_per_pos),
            spec_decode_num_accepted_proposals_per_pos=tuple(
                r.spec_decode_num_accepted_proposals_per_pos),
            spec_decode_num_proposal_sets=r.spec_decode_num_proposal_sets,
            step_seconds_total=r.step_seconds_total,
            worker_forward_seconds_total=r.worker_forward_seconds_total)

    @staticmethod
    async def _unary(method, request, timeout_s: float):
        try:
            return await method(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            raise SchedulerError.from_rpc_error(error) from None
