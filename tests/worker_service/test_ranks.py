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
from tests.worker_service.fake_runtime import FakeRuntimeFactory, fake_next_token

STEP_TIMEOUT_S = 120.0
PROMPT = (5, 6, 7)
OTHER_PROMPT = (8, 9, 10)


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


@pytest.mark.slow  # spawns a rank that loads the real runtime
def test_serve_fails_with_the_cause_when_the_checkpoint_cannot_load(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    shard = next(broken.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    config = WorkerConfig(model_dir=broken, port=0, num_blocks=4)
    with pytest.raises(RankGroupError, match="rank 0 failed to start"):
        asyncio.run(asyncio.wait_for(serve(config), STEP_TIMEOUT_S))


@pytest.mark.slow  # spawns two ranks
def test_two_ranks_run_a_step_handed_over_before_the_last_was_answered_on_the_tokens_it_sampled():
    """Under TP both ranks feed a planned-ahead row the token the step before sampled (the fake's
    all-reduce checks that they computed the same token ids), and its mask reaches the sampler
    after the step was sent."""
    factory = FakeRuntimeFactory()
    config = two_rank_config()
    blocks = (GroupBlocks("window", 0, (0, 1)), GroupBlocks("compressed", 0, (0, 1)))
    first = StepPlan(1, new_sequences=(NewSequence(3, 0, PROMPT), NewSequence(4, 0, PROMPT)),
                     rows=(ScheduledRow(3, 0, 3, new_blocks=blocks, sample=True),
                           ScheduledRow(4, 0, 3, new_blocks=(
                               GroupBlocks("window", 0, (2, 3)),
                               GroupBlocks("compressed", 0, (2, 3))), sample=True)))
    ahead = dict(num_computed_tokens=3, num_new_tokens=1, sample=True, append_last_sampled=True)
    second = StepPlan(2, rows=(ScheduledRow(3, **ahead),
                               ScheduledRow(4, mask_follows=True, **ahead)))

    async def scenario() -> list:
        ranks = RankGroup(rank_specs(config, factory.describe(config)), factory,
                          store_address(config), forms_world_alone=True)
        try:
            await asyncio.wait_for(ranks.start(), STEP_TIMEOUT_S)
            masks: concurrent.futures.Future = concurrent.futures.Future()
            answers = [ranks.hand_over(first), ranks.hand_over(second, masks)]
            first_answer = await asyncio.wait_for(answers[0], STEP_TIMEOUT_S)
            masks.set_result(StepMasks(2, (RowMask(4, TokenMask(allowed_token_ids=(5, 17))),)))
            return [first_answer, await asyncio.wait_for(answers[1], STEP_TIMEOUT_S)]
        finally:
            await ranks.stop()

    first_answer, second_answer = asyncio.run(scenario())
    token = first_answer.results[0].sampled_token_id
    assert token == fake_next_token(0, list(PROMPT))
    assert [(r.sampled_token_id, r.error) for r in second_answer.results] == [
        (fake_next_token(3, [token]), ""), (17, "")]


@pytest.mark.slow  # spawns a rank
def test_steps_whose_callers_gave_up_are_answered_in_turn_so_the_next_step_gets_its_own_answer():
    """A Step stream that ends with two steps handed over leaves their answers to be read in turn:
    the step after the next stream's reset gets its own answer, not one of theirs."""
    factory = FakeRuntimeFactory()
    config = WorkerConfig(model_dir=Path("/nonexistent-fake-model"), port=0, block_size=4)
    blocks = (GroupBlocks("window", 0, (0,)), GroupBlocks("compressed", 0, (0,)))
    # Its mask follows: until the test sends it, step 1 cannot be answered and 2 waits its turn.
    prefill = StepPlan(1, new_sequences=(NewSequence(3, 0, PROMPT),), rows=(
        ScheduledRow(3, 0, 3, new_blocks=blocks, sample=True, mask_follows=True),))
    decode = StepPlan(2, rows=(ScheduledRow(3, 3, 1, sample=True, append_last_sampled=True),))

    async def scenario():
        ranks = RankGroup(rank_specs(config, factory.describe(config)), factory,
                          store_address(config), forms_world_alone=True)
        try:
            await asyncio.wait_for(ranks.start(), STEP_TIMEOUT_S)
            masks: concurrent.futures.Future = concurrent.futures.Future()
            abandoned = [ranks.hand_over(prefill, masks), ranks.hand_over(decode)]
            for future in abandoned:
                future.cancel()  # their callers gave up: the steps still run
            await asyncio.sleep(0)  # the cancellations take effect
            masks.set_result(StepMasks(1, (RowMask(3, TokenMask(allowed_token_ids=(5, 17))),)))
            await ranks.reset()
            fresh = await asyncio.wait_for(ranks.step(StepPlan(
                7, new_sequences=(NewSequence(3, 0, OTHER_PROMPT),),
                rows=(ScheduledRow(3, 0, 3, new_blocks=blocks, sample=True),))), STEP_TIMEOUT_S)
            await asyncio.wait_for(ranks.settled(), STEP_TIMEOUT_S)
            return fresh, ranks.busy
        finally:
            await ranks.stop()

    fresh, busy = asyncio.run(scenario())
    assert fresh.step_id == 7 and not busy
    assert [(r.seq_id, r.sampled_token_id, r.error) for r in fresh.results] == [
        (3, fake_next_token(0, list(OTHER_PROMPT)), "")]
