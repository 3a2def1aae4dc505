"""Speculative steps on a sharded layout — dp2 × tp2 attention, ep4 experts, so the target and the
drafter run TP gathers and EP exchanges — give, row for row, the single-rank run's bonus tokens,
accepted counts and proposals, through the worker's own rank processes and executors.

The script (speculative_script.py) has partition 1 idle while partition 0 prefills and drafts,
partition 1 prefilling without sampling while partition 0 verifies and proposes, and partition 0
done (its sequences released) while partition 1 still drafts: the steps in which a rank whose
partition drafts nothing must still meet the others in the drafter's expert collectives.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from services.common.config import SpeculativeConfig, TopologyConfig, WorkerConfig
from services.worker.executor import PartitionExecutor
from services.worker.model.collectives import LocalCollectives
from services.worker.model.runtime import ModelRuntime, RuntimeConfig
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint
from services.worker.rank_plan import ModelRuntimeFactory, rank_specs, store_address
from services.worker.ranks import RankGroup
from tests.worker.chunked_runs import prefill_and_decode
from tests.worker_service.speculative_script import Sequence, SpeculativeScript

pytestmark = pytest.mark.slow  # spawns four rank processes per case

BLOCK_SIZE, BLOCKS_PER_SEQUENCE, CHUNK = 16, 6, 16
NUM_TOKENS = 12
STEP_TIMEOUT_S = 180.0
SHARDED = TopologyConfig(dp=2, tp=2, ep=4)
# (seq_id, partition, prompt length, first step): partition 1 joins at step 3 with a prompt of
# three chunks; partition 0's sequences finish first.
SEQUENCES = ((1, 0, 20, 0), (2, 0, 9, 1), (3, 1, 40, 3))


def worker_config(model_dir: Path, topology: TopologyConfig,
                  spec: SpeculativeConfig) -> WorkerConfig:
    return WorkerConfig(model_dir=model_dir, port=0, block_size=BLOCK_SIZE,
                        num_blocks=len(SEQUENCES) * BLOCKS_PER_SEQUENCE, topology=topology,
                        speculative=spec)


def sequences(model_dir: Path, num_drafts: int) -> list[Sequence]:
    """The script's sequences with their K=0 greedy continuations."""
    runtime = ModelRuntime(RuntimeConfig(model_dir, torch.float32, "cpu", BLOCK_SIZE,
                                         BLOCKS_PER_SEQUENCE))
    tables = runtime.cache.same_table_for_every_group(list(range(BLOCKS_PER_SEQUENCE)))
    generator = torch.Generator().manual_seed(5)
    out = []
    for seq_id, partition, length, first_step in SEQUENCES:
        prompt = torch.randint(2, 120_000, (length,), generator=generator).tolist()
        tokens, _ = prefill_and_decode(runtime, seq_id, prompt, tables, CHUNK,
                                       NUM_TOKENS + num_drafts)
        out.append(Sequence(seq_id, partition, tuple(prompt), first_step, tuple(tokens)))
    return out


def script(config: WorkerConfig, seqs: list[Sequence], sharded: bool) -> SpeculativeScript:
    facts = ModelRuntimeFactory().describe(config)
    num_drafts = config.speculative.num_speculative_tokens
    return SpeculativeScript(seqs, num_drafts, NUM_TOKENS,
                             tuple(g.name for g in facts.block_groups), BLOCKS_PER_SEQUENCE,
                             CHUNK, facts.vocab_size,
                             (lambda s: s.partition_id) if sharded else (lambda s: 0))


def run_single_rank(config: WorkerConfig, plan_script: SpeculativeScript) -> int:
    """The script on one in-process rank; returns the drafter's live sequences afterwards."""
    factory = ModelRuntimeFactory()
    spec = rank_specs(config, factory.describe(config))[0]
    runtime = factory.build(spec, LocalCollectives())
    executor = PartitionExecutor(runtime, spec.limits)
    for plan in plan_script.plans():
        plan_script.record(plan, executor.execute(plan))
    return runtime.drafter.live_sequences


def run_sharded(config: WorkerConfig, plan_script: SpeculativeScript) -> None:
    """The script on the worker's rank processes (one world, this host)."""
    factory = ModelRuntimeFactory()

    async def scenario() -> None:
        ranks = RankGroup(rank_specs(config, factory.describe(config)), factory,
                          store_address(config), forms_world_alone=True)
        try:
            await asyncio.wait_for(ranks.start(), STEP_TIMEOUT_S)
            for plan in plan_script.plans():
                plan_script.record(plan, await asyncio.wait_for(ranks.step(plan),
                                                               STEP_TIMEOUT_S))
        finally:
            await ranks.stop()
    asyncio.run(scenario())


@pytest.fixture(scope="module")
def dspark_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-dspark"), "tiny-dspark", seed=1)


@pytest.mark.parametrize("method, num_drafts", [("dspark", 7), ("mtp", 3)])
def test_a_sharded_layout_verifies_and_drafts_what_one_rank_does(
        method: str, num_drafts: int, dspark_dir: Path, tiny_model_dir: Path) -> None:
    model_dir = dspark_dir if method == "dspark" else tiny_model_dir
    spec = SpeculativeConfig(method, num_drafts)
    seqs = sequences(model_dir, num_drafts)
    single_config = worker_config(model_dir, TopologyConfig(), spec)
    alone = script(single_config, seqs, sharded=False)
    assert run_single_rank(single_config, alone) == 0
    sharded = script(single_config, seqs, sharded=True)
    run_sharded(worker_config(model_dir, SHARDED, spec), sharded)

    assert sharded.verdicts() == alone.verdicts()
    assert sharded.tokens() == {s.seq_id: list(s.continuation[:NUM_TOKENS]) for s in seqs}
    accepted = {v.num_accepted for verdicts in alone.verdicts().values() for v in verdicts}
    assert 0 in accepted and num_drafts in accepted  # rejections and full acceptances
    assert all(len(v.proposals) == num_drafts for verdicts in alone.verdicts().values()
               for v in verdicts)
