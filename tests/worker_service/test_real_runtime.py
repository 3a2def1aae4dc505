"""The worker serving the real DeepSeek-V4 runtime on the tiny checkpoint through a real rank
process: the tokens that come back over gRPC are the tokens the bare runtime produces."""
from __future__ import annotations

import pytest
import torch
from grpc_health.v1 import health_pb2

from services.common.config import WorkerConfig
from services.common.pb.dsv4serve.v1 import worker_pb2, worker_pb2_grpc
from services.worker.model.config import ModelConfig
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
from tests.worker_service.worker_harness import (StepStream, local_channel, wait_for_health,
                                                 worker_in_thread)

BLOCK_SIZE = 32
NUM_BLOCKS = 8
PROMPT = [100, 2000, 31, 4444, 5, 60606, 7, 888, 9999, 10]
NUM_DECODES = 3


def bare_runtime_tokens(model_dir) -> list[int]:
    runtime = ModelRuntime(RuntimeConfig(model_dir=model_dir, dtype=torch.float32, device="cpu",
                                         block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))
    tables = runtime.cache.same_table_for_every_group([0])
    tokens = runtime.step([SequenceChunk(1, 0, PROMPT, tables, sample=True)]).sampled
    for position in range(len(PROMPT), len(PROMPT) + NUM_DECODES):
        chunk = SequenceChunk(1, position, [tokens[-1]], tables, sample=True)
        tokens += runtime.step([chunk]).sampled
    return tokens


@pytest.mark.slow
def test_served_tokens_equal_the_bare_runtime(tiny_model_dir):
    expected = bare_runtime_tokens(tiny_model_dir)
    model = ModelConfig.from_json_file(tiny_model_dir / "config.json")
    config = WorkerConfig(model_dir=tiny_model_dir, port=0, block_size=BLOCK_SIZE,
                          num_blocks=NUM_BLOCKS)
    with worker_in_thread(config) as worker, local_channel(worker.address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        reply = stub.Describe(worker_pb2.DescribeRequest(), timeout=60)
        assert (reply.vocab_size, reply.eos_token_id) == (model.vocab_size, model.eos_token_id)
        assert [(g.name, g.num_blocks) for g in reply.block_groups] == [
            ("window", NUM_BLOCKS), ("compressed", NUM_BLOCKS), ("csa_state", NUM_BLOCKS),
            ("hca_state", NUM_BLOCKS)]
        groups = [g.name for g in reply.block_groups]
        wait_for_health(channel, health_pb2.HealthCheckResponse.SERVING, timeout_s=600)
        stream = StepStream(channel, timeout_s=600)
        first = stream.call(worker_pb2.StepRequest(
            step_id=1, new_sequences=[worker_pb2.NewSequence(seq_id=9, prompt_token_ids=PROMPT)],
            rows=[worker_pb2.ScheduledRow(seq_id=9, num_new_tokens=len(PROMPT), sample=True,
                                          new_blocks=[worker_pb2.GroupBlocks(group=group,
                                                                             block_ids=[3])
                                                      for group in groups])]))
        served = [first.results[0].sampled_token_id]
        for step_id, position in enumerate(range(len(PROMPT), len(PROMPT) + NUM_DECODES), start=2):
            row = worker_pb2.ScheduledRow(seq_id=9, num_computed_tokens=position, num_new_tokens=1,
                                          append_token_ids=[served[-1]], sample=True)
            reply = stream.call(worker_pb2.StepRequest(step_id=step_id, rows=[row]))
            assert not reply.error and not reply.results[0].error
            served.append(reply.results[0].sampled_token_id)
        stream.close()
    assert served == expected
