"""The scheduler against the real worker (tiny random checkpoint, CPU), in process: the descriptors
the scheduler builds are accepted, batching does not change greedy tokens, and a constrained request
runs with the real XGrammar matcher."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import AsyncIterator

import grpc
import pytest

from services.common.config import WorkerConfig
from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from services.common.pb.dsv4serve.v1 import scheduler_pb2_grpc
from services.scheduler.server import start_scheduler_server
from services.worker.server import start_worker_server
from tests.scheduler.grpc_harness import Harness, scheduler_config

pytestmark = pytest.mark.slow

BLOCK_SIZE = 32


@contextlib.asynccontextmanager
async def real_stack(model_dir: Path) -> AsyncIterator[Harness]:
    worker = await start_worker_server(WorkerConfig(
        model_dir=model_dir, port=0, block_size=BLOCK_SIZE, max_model_len=256,
        max_num_batched_tokens=256, num_blocks=32))
    config = replace(scheduler_config((worker.address,)), model_dir=model_dir,
                     block_size=BLOCK_SIZE, max_model_len=256)
    scheduler = await start_scheduler_server(config)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{scheduler.port}")
    harness = Harness(scheduler, [], scheduler_pb2_grpc.SchedulerStub(channel), channel)
    try:
        await worker.wait_ready()
        await harness.wait_ready()
        yield harness
    finally:
        await channel.close()
        await scheduler.stop(0)
        await worker.stop()


def tokens_of(messages: list[pb.GenerateResponse]) -> list[int]:
    return [t for m in messages if m.HasField("tokens") for t in m.tokens.token_ids]


def test_real_worker_batching_matches_alone_and_constraints_run(tiny_model_dir: Path):
    prompts = [list(range(10, 40)), list(range(100, 110))]

    async def scenario():
        async with real_stack(tiny_model_dir) as stack:
            alone = [tokens_of(await stack.generate(f"alone-{i}", p, 4))
                     for i, p in enumerate(prompts)]
            together = await asyncio.gather(*(stack.generate(f"together-{i}", p, 4)
                                              for i, p in enumerate(prompts)))
            assert [tokens_of(m) for m in together] == alone
            assert all(len(tokens) == 4 for tokens in alone)
            json_object = pb.Constraint(type=pb.CONSTRAINT_TYPE_JSON_OBJECT)
            constrained = await stack.generate("json", prompts[0], 8, constraint=json_object)
            assert constrained[0].admitted.constrained
            assert constrained[-1].HasField("finished")
            state = await stack.wait_idle()
            assert state.num_live_matchers == 0 and state.grammar_cache_entries == 1
    asyncio.run(scenario())
