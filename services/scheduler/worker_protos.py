"""Conversions between worker.proto messages and the scheduler's step dataclasses."""
from __future__ import annotations

from services.common.pb.dsv4serve.v1 import worker_pb2
from services.scheduler.kv_cache import BlockGroupSpec
from services.scheduler.step_plan import (RowResult, ScheduledRow, StepPlan, StepResult,
                                          WorkerDescription)


def description_from_proto(response: worker_pb2.DescribeResponse) -> WorkerDescription:
    return WorkerDescription(
        abi_version=response.abi_version, build_id=response.build_id,
        model_fingerprint=response.model_fingerprint, block_size=response.block_size,
        vocab_size=response.vocab_size, eos_token_id=response.eos_token_id,
        partition_ids=tuple(response.partition_ids),
        block_groups=tuple(BlockGroupSpec(g.name, g.num_blocks, g.sliding_window)
                           for g in response.block_groups),
        max_num_batched_tokens=response.max_num_batched_tokens)


def plan_to_proto(plan: StepPlan) -> worker_pb2.StepRequest:
    return worker_pb2.StepRequest(
        step_id=plan.step_id,
        new_sequences=[worker_pb2.NewSequence(
            seq_id=s.seq_id, partition_id=s.partition_id, prompt_token_ids=s.prompt_token_ids,
            logit_bias_token_ids=s.logit_bias_token_ids, logit_bias_values=s.logit_bias_values,
            request_id=s.request_id)
            for s in plan.new_sequences],
        rows=[_row_to_proto(row) for row in plan.rows],
        finished_seq_ids=plan.finished_seq_ids)


def _row_to_proto(row: ScheduledRow) -> worker_pb2.ScheduledRow:
    message = worker_pb2.ScheduledRow(
        seq_id=row.seq_id, num_computed_tokens=row.num_computed_tokens,
        num_new_tokens=row.num_new_tokens, append_token_ids=row.append_token_ids,
        new_block_ids=row.new_block_ids, new_window_block_ids=row.new_window_block_ids,
        sample=row.sample)
    if row.mask is not None:
        if row.mask.allowed_token_ids is not None:
            message.mask.allowed_token_ids.extend(row.mask.allowed_token_ids)
        else:
            message.mask.bitmask = row.mask.bitmask
    return message


def result_from_proto(response: worker_pb2.StepResponse) -> StepResult:
    return StepResult(
        step_id=response.step_id,
        results=[RowResult(r.seq_id,
                           r.sampled_token_id if r.HasField("sampled_token_id") else None, r.error)
                 for r in response.results],
        forward_ns=response.forward_ns, error=response.error)


def merge_results(results: list[StepResult]) -> StepResult:
    """One result from every worker's answer: for each row the first answer carrying a token or
    an error wins (workers answer only for rows of the partitions they hold)."""
    rows: dict[int, RowResult] = {}
    for result in results:
        for row in result.results:
            known = rows.get(row.seq_id)
            if known is None or (known.sampled_token_id is None and not known.error):
                rows[row.seq_id] = row
    error = "; ".join(r.error for r in results if r.error)
    return StepResult(step_id=results[0].step_id, results=list(rows.values()),
                      forward_ns=max(r.forward_ns for r in results), error=error)
