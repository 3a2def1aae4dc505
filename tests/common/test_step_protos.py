"""Step descriptors survive the trip through worker.proto field for field: the encoder sets only
the fields a row uses, so every optional part is checked alone and all together."""
from __future__ import annotations

import dataclasses

import pytest

from services.common.pb.dsv4serve.v1 import worker_pb2
from services.common.step_descriptors import (GroupBlocks, NewSequence, RowMask, RowResult,
                                              ScheduledRow, StepMasks, StepPlan, StepResult,
                                              TokenMask)
from services.common.step_protos import (masks_from_proto, masks_to_proto, plan_from_proto,
                                         plan_to_proto, result_from_proto, result_to_proto)

PLAIN = ScheduledRow(seq_id=7, num_computed_tokens=40, num_new_tokens=1)
OPTIONAL_PARTS = {
    "append_token_ids": (11, 12),
    "new_blocks": (GroupBlocks("window", 1, (5,)), GroupBlocks("compressed", 0, (2, 3))),
    "sample": True,
    "mask": TokenMask(allowed_token_ids=(3, 9)),
    "partition_id": 2,
    "draft_token_ids": (4, 5),
    "draft_forced": (False, True),
    "draft_masks": (TokenMask(refused_token_ids=(1,)), TokenMask(bitmask=b"\x01\x00\x00\x00")),
    "num_proposals": 3,
    "append_last_sampled": True,
    "mask_follows": True,
}


def round_trip(plan: StepPlan) -> StepPlan:
    return plan_from_proto(worker_pb2.StepRequest.FromString(
        plan_to_proto(plan).SerializeToString()))


@pytest.mark.parametrize("part", sorted(OPTIONAL_PARTS))
def test_a_row_with_one_optional_part_comes_back_equal(part):
    row = dataclasses.replace(PLAIN, **{part: OPTIONAL_PARTS[part]})
    assert round_trip(StepPlan(3, rows=[row])).rows == [row]


def test_a_plan_with_every_part_comes_back_equal():
    full_row = dataclasses.replace(PLAIN, **OPTIONAL_PARTS)
    plan = StepPlan(9, new_sequences=[NewSequence(7, 2, (1, 2, 3), (4,), (-1.5,), "req-1", 2)],
                    rows=[PLAIN, full_row, dataclasses.replace(PLAIN, seq_id=8, num_new_tokens=4)],
                    finished_seq_ids=[1, 2])
    assert round_trip(plan) == plan


def test_masks_and_results_come_back_equal():
    masks = StepMasks(4, (RowMask(7, TokenMask(allowed_token_ids=(2,))), RowMask(8, discard=True)))
    assert masks_from_proto(worker_pb2.StepRequest.FromString(
        masks_to_proto(masks).SerializeToString())) == masks
    result = StepResult(4, (RowResult(7, 12), RowResult(8, None, "bad row"),
                            RowResult(9, 0, "", 2, (5, 6))), forward_ns=123)
    assert result_from_proto(worker_pb2.StepResponse.FromString(
        result_to_proto(result).SerializeToString())) == result
