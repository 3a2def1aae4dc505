"""Rank processes: several ranks see every descriptor, rank 0 answers, failures are reported with
their cause, and nothing outlives a stop."""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
from pathlib import Path

import pytest

from services.common.config import TopologyConfig, WorkerConfig
from services.common.step_descriptors import (GroupBlocks, NewSequence, RowMask, ScheduledRow,
                                               StepMasks, StepPlan, TokenMask)
from services.worker.rank_plan import rank_specs, store_address
from services.worker.ranks import RankGroup, RankGroupError
from services.worker.server import serve
from services.worker.step_stream import LastSampled
from tests.worker_service.fake_runtime import FakeRuntimeFactory, fake_next_token

STEP_TIMEOUT_S = 120.0
PROMPT = (5, 6, 7)


def assert_processes_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def two_rank_config() -> WorkerConfig:
    return WorkerConfig(model_dir=Path("/nonexistent-fake-model"), port=0, block_size=4,
                        topology=TopologyConfig(tp=2))


@pytest.mark.slow  # spawns two ranks
def test_two_ranks_run_every_step_and_rank0_answers():
    factory = FakeRuntimeFactory()
    config = two_rank_config()

    async def scenario() -> tuple[list, list[int]]:
        ranks = RankGroup(rank_specs(config, factory.describe(config)), factory,
                          store_address(config), forms_world_alone=True)
        try:
            await asyncio.wait_for(ranks.start(), STEP_TIMEOUT_S)
            pids = ranks.pids
            plan = StepPlan(1, new_sequences=(NewSequence(3, 0, PROMPT),),
                            rows=(ScheduledRow(3, 0, 3, new_blocks=(
                                GroupBlocks("window", 0, (0,)),
                                GroupBlocks("compressed", 0, (0,))), sample=True),))
            first = await asyncio.wait_for(ranks.step(plan), STEP_TIMEOUT_S)
            await ranks.reset()
            after_reset = await asyncio.wait_for(ranks.step(StepPlan(2, rows=plan.rows)),
                                                 STEP_TIMEOUT_S)
            return [first, after_reset], pids
        finally:
            await ranks.stop()

    (first, after_reset), pids = asyncio.run(scenario())
    assert len(pids) == 2
    assert first.results[0].error == ""  # the fake's all-reduce agreed: both ranks ran the step
    assert first.results[0].sampled_token_id == fake_next_token(0, list(PROMPT))
    assert "unknown seq_id 3" in after_reset.results[0].error
    assert_processes_gone(pids)


def blocks_from(first_block: int) -> tuple[GroupBlocks, ...]:
    return (GroupBlocks("window", first_block, (first_block,)),
            GroupBlocks("compressed", first_block, (first_block,)))


def prefill(step_id: int, seq_id: int) -> StepPlan:
    return StepPlan(step_id, new_sequences=[NewSequence(seq_id, 0, PROMPT)],
                    rows=[ScheduledRow(seq_id, 0, len(PROMPT), new_blocks=blocks_from(0),
                                       sample=True)])


def decode(step_id: int, seq_id: int, position: int, **row) -> StepPlan:
    """One position fed the token the sequence's previous row sampled."""
    return StepPlan(step_id, rows=[ScheduledRow(seq_id, position, 1, sample=True,
                                                append_last_sampled=True, **row)])


@pytest.mark.slow  # spawns two ranks
def test_a_step_sent_ahead_whose_stream_ended_is_collected_before_the_next_command():
    """Step N+1 goes to the ranks, fed N's token, as soon as N is answered (before its own
    command runs); when its command is withdrawn (the stream ended), the next command collects its
    answers first, so the next stream's steps get their own answers."""
    factory = FakeRuntimeFactory()
    config = two_rank_config()

    async def scenario():
        ranks = RankGroup(rank_specs(config, factory.describe(config)), factory,
                          store_address(config), forms_world_alone=True)
        try:
            await asyncio.wait_for(ranks.start(), STEP_TIMEOUT_S)
            last_sampled, masks = LastSampled(), concurrent.futures.Future()
            first = asyncio.ensure_future(ranks.step(prefill(1, 3), None, last_sampled))
            second = asyncio.ensure_future(ranks.step(decode(2, 3, 3, mask_follows=True), masks,
                                                      last_sampled))
            withdrawn = asyncio.ensure_future(ranks.step(
                decode(3, 3, 4, new_blocks=blocks_from(1)), None, last_sampled))
            answers = [await asyncio.wait_for(first, STEP_TIMEOUT_S)]
            withdrawn.cancel()  # not started: the second step's command waits for its masks
            masks.set_result(StepMasks(2, (RowMask(3, TokenMask(allowed_token_ids=(42,))),)))
            answers.append(await asyncio.wait_for(second, STEP_TIMEOUT_S))
            sent_ahead = ranks.busy  # the third step runs on the ranks, its command withdrawn
            await ranks.reset()
            answers.append(await asyncio.wait_for(ranks.step(prefill(4, 5)), STEP_TIMEOUT_S))
            return answers, sent_ahead, ranks.busy
        finally:
            await ranks.stop()

    (first, second, next_stream), sent_ahead, busy_after = asyncio.run(scenario())
    token = fake_next_token(0, list(PROMPT))
    assert first.results[0].sampled_token_id == token
    # Both ranks were fed the same token (the fake's all-reduce agreed); the late mask applied.
    assert second.results[0].error == ""
    assert second.results[0].sampled_token_id == 42
    assert sent_ahead and not busy_after
    assert (next_stream.step_id, next_stream.results[0].seq_id) == (4, 5)
    assert next_stream.results[0].sampled_token_id == token


@pytest.mark.slow  # spawns a rank that loads the real runtime
def test_serve_fails_with_the_cause_when_the_checkpoint_cannot_load(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    shard = next(broken.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    config = WorkerConfig(model_dir=broken, port=0, num_blocks=4)
    with pytest.raises(RankGroupError, match="rank 0 failed to start"):
        asyncio.run(asyncio.wait_for(serve(config), STEP_TIMEOUT_S))
