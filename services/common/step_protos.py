"""worker.proto messages ↔ the step dataclasses of `step_descriptors.py` (both directions)."""
from __future__ import annotations

from typing import Any, Callable

from services.common.pb.dsv4serve.v1 import worker_pb2
from services.common.step_descriptors import (GroupBlocks, NewSequence, RowMask, RowResult,
                                              ScheduledRow, StepMasks, StepPlan, StepResult,
                                              TokenMask)


def plan_to_proto(plan: StepPlan) -> worker_pb2.StepRequest:
    request = worker_pb2.StepRequest(
        step_id=plan.step_id,
        new_sequences=[worker_pb2.NewSequence(
            seq_id=s.seq_id, partition_id=s.partition_id, prompt_token_ids=s.prompt_token_ids,
            logit_bias_token_ids=s.logit_bias_token_ids, logit_bias_values=s.logit_bias_values,
            request_id=s.request_id, num_cached_tokens=s.num_cached_tokens)
            for s in plan.new_sequences],
        finished_seq_ids=plan.finished_seq_ids)
    for row in plan.rows:
        _add_row(request.rows, row)
    return request


def _add_row(rows: Any, row: ScheduledRow) -> None:
    """Appends the row in place (a message passed in a list is copied) and sets only the fields
    the row sets: 256 decode rows took 1.0 ms with every field passed, 0.3 ms this way."""
    message = rows.add(seq_id=row.seq_id, num_computed_tokens=row.num_computed_tokens,
                       num_new_tokens=row.num_new_tokens)
    if row.sample:
        message.sample = True
    if row.append_last_sampled:
        message.append_last_sampled = True
    if row.partition_id:
        message.partition_id = row.partition_id
    if row.append_token_ids:
        message.append_token_ids.extend(row.append_token_ids)
    if row.mask_follows:
        message.mask_follows = True
    if row.new_blocks:
        for g in row.new_blocks:
            message.new_blocks.add(group=g.group, first_logical_block=g.first_logical_block,
                                   block_ids=g.block_ids)
    if row.mask is not None:
        message.mask.CopyFrom(_mask_to_proto(row.mask))
    if row.draft_token_ids or row.draft_forced or row.draft_masks or row.num_proposals:
        message.draft_token_ids.extend(row.draft_token_ids)
        message.draft_forced.extend(row.draft_forced)
        message.draft_masks.extend(_mask_to_proto(mask) for mask in row.draft_masks)
        message.num_proposals = row.num_proposals


def masks_to_proto(masks: StepMasks) -> worker_pb2.StepRequest:
    """A masks message: a StepRequest with only `masks` set (no step)."""
    rows = [worker_pb2.RowMask(seq_id=row.seq_id, discard=row.discard,
                               mask=_mask_to_proto(row.mask) if row.mask is not None else None)
            for row in masks.rows]
    return worker_pb2.StepRequest(masks=worker_pb2.StepMasks(step_id=masks.step_id, rows=rows))


def is_masks_message(request: worker_pb2.StepRequest) -> bool:
    return request.HasField("masks")


def masks_from_proto(request: worker_pb2.StepRequest) -> StepMasks:
    return StepMasks(step_id=request.masks.step_id, rows=tuple(
        RowMask(seq_id=row.seq_id, discard=row.discard,
                mask=_mask_from_proto(row.mask) if row.HasField("mask") else None)
        for row in request.masks.rows))


def _mask_to_proto(mask: TokenMask) -> worker_pb2.TokenMask:
    return worker_pb2.TokenMask(allowed_token_ids=mask.allowed_token_ids, bitmask=mask.bitmask,
                                refused_token_ids=mask.refused_token_ids)


def _mask_from_proto(mask: worker_pb2.TokenMask) -> TokenMask:
    return TokenMask(allowed_token_ids=tuple(mask.allowed_token_ids), bitmask=mask.bitmask,
                     refused_token_ids=tuple(mask.refused_token_ids))


def plan_from_proto(request: worker_pb2.StepRequest) -> StepPlan:
    return StepPlan(
        step_id=request.step_id,
        new_sequences=[NewSequence(
            seq_id=new.seq_id, partition_id=new.partition_id,
            prompt_token_ids=tuple(new.prompt_token_ids),
            logit_bias_token_ids=tuple(new.logit_bias_token_ids),
            logit_bias_values=tuple(new.logit_bias_values), request_id=new.request_id,
            num_cached_tokens=new.num_cached_tokens)
            for new in request.new_sequences],
        rows=[_row_from_proto(row) for row in request.rows],
        finished_seq_ids=list(request.finished_seq_ids))


def _row_from_proto(row: worker_pb2.ScheduledRow) -> ScheduledRow:
    """Every field the row sets, and only those (one ListFields call: presence tests of the
    optional repeated fields one by one cost about as much, and a missed one would drop a field
    that the worker's row checks must see)."""
    fields: dict[str, Any] = {"seq_id": 0, "num_computed_tokens": 0, "num_new_tokens": 0}
    for field, value in row.ListFields():
        convert = _ROW_FIELD_DECODERS.get(field.name)
        fields[field.name] = value if convert is None else convert(value)
    return ScheduledRow(**fields)


def _blocks_from_proto(groups: Any) -> tuple[GroupBlocks, ...]:
    return tuple(GroupBlocks(g.group, g.first_logical_block, tuple(g.block_ids)) for g in groups)


_ROW_FIELD_DECODERS: dict[str, Callable[[Any], Any]] = {
    "append_token_ids": tuple, "new_blocks": _blocks_from_proto, "mask": _mask_from_proto,
    "draft_token_ids": tuple, "draft_forced": tuple,
    "draft_masks": lambda masks: tuple(_mask_from_proto(m) for m in masks)}


def result_to_proto(result: StepResult) -> worker_pb2.StepResponse:
    response = worker_pb2.StepResponse(step_id=result.step_id, forward_ns=result.forward_ns,
                                       error=result.error)
    for row in result.results:
        message = response.results.add(seq_id=row.seq_id)  # in place; only the fields set
        if row.sampled_token_id is not None:
            message.sampled_token_id = row.sampled_token_id
        if row.error:
            message.error = row.error
        if row.num_accepted_drafts or row.proposed_token_ids:
            message.num_accepted_drafts = row.num_accepted_drafts
            message.proposed_token_ids.extend(row.proposed_token_ids)
    return response


def result_from_proto(response: worker_pb2.StepResponse) -> StepResult:
    return StepResult(
        step_id=response.step_id,
        results=tuple(RowResult(r.seq_id,
                                r.sampled_token_id if r.HasField("sampled_token_id") else None,
                                r.error, r.num_accepted_drafts, tuple(r.proposed_token_ids))
                      for r in response.results),
        forward_ns=response.forward_ns, error=response.error)
