"""The Worker gRPC service with a fake runtime in a real rank process: handshake, Step stream
semantics, health, reflection, and what happens when a rank dies."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common.build_info import ABI_VERSION, build_id
from services.common.config import WorkerConfig
from services.common.pb.dsv4serve.v1 import worker_pb2, worker_pb2_grpc
from tests.worker_service.fake_runtime import (CRASH_TOKEN_ID, FAKE_EOS_TOKEN_ID, FAKE_NUM_BLOCKS,
                                               FAKE_VOCAB_SIZE, FakeRuntimeFactory, fake_next_token)
from tests.worker_service.worker_harness import (StepStream, local_channel, wait_for_health,
                                                 worker_in_thread)

BLOCK_SIZE = 4
PROMPT = [21, 22, 23, 24, 25]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def worker_config() -> WorkerConfig:
    return WorkerConfig(model_dir=Path("/nonexistent-fake-model"), port=0, block_size=BLOCK_SIZE,
                        max_num_batched_tokens=512)


@pytest.fixture(scope="module")
def worker():
    with worker_in_thread(worker_config(), FakeRuntimeFactory()) as running:
        yield running


@pytest.fixture
def channel(worker):
    with local_channel(worker.address) as chan:
        wait_for_health(chan, SERVING)
        yield chan


def new_sequence(seq_id: int, prompt=PROMPT) -> worker_pb2.NewSequence:
    return worker_pb2.NewSequence(seq_id=seq_id, partition_id=0, prompt_token_ids=prompt)


def prefill_row(seq_id: int, blocks: list[int], prompt=PROMPT, **fields) -> worker_pb2.ScheduledRow:
    return worker_pb2.ScheduledRow(seq_id=seq_id, num_computed_tokens=0, num_new_tokens=len(prompt),
                                   new_blocks=[worker_pb2.GroupBlocks(group=g, block_ids=blocks)
                                               for g in ("window", "compressed")], sample=True,
                                   **fields)


def decode_row(seq_id: int, position: int, token: int, **fields) -> worker_pb2.ScheduledRow:
    return worker_pb2.ScheduledRow(seq_id=seq_id, num_computed_tokens=position, num_new_tokens=1,
                                   append_token_ids=[token], sample=True, **fields)


class TestDescribe:
    def test_handshake_reports_versions_model_and_capacity(self, channel):
        reply = worker_pb2_grpc.WorkerStub(channel).Describe(
            worker_pb2.DescribeRequest(scheduler_abi_version=ABI_VERSION), timeout=10)
        assert (reply.abi_version, reply.build_id) == (ABI_VERSION, build_id())
        assert reply.model_fingerprint == "fake-fingerprint"
        topology = reply.topology
        assert (topology.world_size, topology.dp, topology.tp, topology.ep) == (1, 1, 1, 1)
        assert list(topology.host_ranks) == [0] and topology.backend == "cpu"
        assert (reply.block_size, reply.vocab_size, reply.eos_token_id) == (
            BLOCK_SIZE, FAKE_VOCAB_SIZE, FAKE_EOS_TOKEN_ID)
        assert list(reply.partition_ids) == [0]
        assert {(g.name, g.num_blocks) for g in reply.block_groups} == {
            ("window", FAKE_NUM_BLOCKS), ("compressed", FAKE_NUM_BLOCKS)}
        assert {f.name for f in reply.cache_families} == {"ori", "cmp_c4"}
        assert reply.max_num_batched_tokens == 512 and reply.compute_dtype == "float32"


class TestOperations:
    def test_health_is_serving_for_the_server_and_the_worker_service(self, channel):
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "dsv4serve.v1.Worker"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == SERVING

    def test_reflection_lists_worker_and_health(self, channel):
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
        names = {service.name for reply in replies
                 for service in reply.list_services_response.service}
        assert {"dsv4serve.v1.Worker", "grpc.health.v1.Health"} <= names


class TestStepStream:
    def test_pipelined_steps_are_answered_in_order_with_their_ids(self, channel):
        stream = StepStream(channel)
        stream.send(worker_pb2.StepRequest(step_id=10, new_sequences=[new_sequence(1)],
                                           rows=[prefill_row(1, [0, 1])]))
        stream.send(worker_pb2.StepRequest(step_id=11, new_sequences=[new_sequence(2)],
                                           rows=[prefill_row(2, [2, 3])]))
        stream.send(worker_pb2.StepRequest(step_id=12))
        replies = [stream.receive() for _ in range(3)]
        stream.close()
        assert [r.step_id for r in replies] == [10, 11, 12]
        assert [[row.sampled_token_id for row in r.results] for r in replies[:2]] == [
            [fake_next_token(0, PROMPT)]] * 2
        assert not replies[2].results and not replies[2].error

    def test_decode_rows_continue_from_the_committed_tokens(self, channel):
        stream = StepStream(channel)
        first = stream.call(worker_pb2.StepRequest(step_id=1, new_sequences=[new_sequence(7)],
                                                   rows=[prefill_row(7, [0, 1])]))
        token = first.results[0].sampled_token_id
        second = stream.call(worker_pb2.StepRequest(step_id=2,
                                                    rows=[decode_row(7, len(PROMPT), token)]))
        stream.close()
        assert second.results[0].sampled_token_id == fake_next_token(len(PROMPT), [token])
        assert second.forward_ns > 0

    def test_a_row_planned_ahead_is_fed_its_last_sampled_token_and_awaits_its_mask(self, channel):
        stream = StepStream(channel)
        stream.send(worker_pb2.StepRequest(step_id=1, new_sequences=[new_sequence(4), new_sequence(5)],
                                           rows=[prefill_row(4, [0, 1]), prefill_row(5, [2, 3])]))
        # Sent before step 1's answer: both rows feed the token step 1 samples; 5's mask follows.
        ahead = dict(num_computed_tokens=len(PROMPT), num_new_tokens=1, sample=True,
                     append_last_sampled=True)
        stream.send(worker_pb2.StepRequest(step_id=2, rows=[
            worker_pb2.ScheduledRow(seq_id=4, **ahead),
            worker_pb2.ScheduledRow(seq_id=5, mask_follows=True, **ahead)]))
        first = stream.receive()
        stream.send(worker_pb2.StepRequest(masks=worker_pb2.StepMasks(step_id=2, rows=[
            worker_pb2.RowMask(seq_id=5, mask=worker_pb2.TokenMask(allowed_token_ids=[3, 8]))])))
        second = stream.receive()
        stream.close()
        token = first.results[0].sampled_token_id
        assert [r.sampled_token_id for r in second.results] == [
            fake_next_token(len(PROMPT), [token]), 8]

    def test_a_call_cancelled_while_a_step_awaits_its_masks_leaves_the_worker_serving(self, channel):
        stream = StepStream(channel)
        stream.send(worker_pb2.StepRequest(step_id=1, new_sequences=[new_sequence(6)],
                                           rows=[prefill_row(6, [0, 1])]))
        stream.send(worker_pb2.StepRequest(step_id=2, rows=[worker_pb2.ScheduledRow(
            seq_id=6, num_computed_tokens=len(PROMPT), num_new_tokens=1, sample=True,
            append_last_sampled=True, mask_follows=True)]))
        stream.receive()
        stream.cancel()  # step 2's masks never come
        fresh = StepStream(channel)
        reply = fresh.call(worker_pb2.StepRequest(step_id=1, new_sequences=[new_sequence(6)],
                                                  rows=[prefill_row(6, [0, 1])]))
        fresh.close()
        assert [r.sampled_token_id for r in reply.results] == [fake_next_token(0, PROMPT)]

    def test_row_error_leaves_neighbours_computed(self, channel):
        stream = StepStream(channel)
        reply = stream.call(worker_pb2.StepRequest(
            step_id=1, new_sequences=[new_sequence(1), new_sequence(2), new_sequence(3)],
            rows=[prefill_row(1, [0, 1]), prefill_row(2, [2]),  # too few blocks for 5 tokens
                  prefill_row(3, [4, 5], mask=worker_pb2.TokenMask(allowed_token_ids=[3, 9]))]))
        stream.close()
        assert not reply.error
        outcomes = [(r.seq_id, r.HasField("sampled_token_id"), bool(r.error))
                    for r in reply.results]
        assert outcomes == [(1, True, False), (2, False, True), (3, True, False)]
        assert "missing window blocks" in reply.results[1].error
        assert reply.results[2].sampled_token_id == 9

    def test_new_stream_starts_with_no_sequences(self, channel):
        first = StepStream(channel)
        token = first.call(worker_pb2.StepRequest(
            step_id=1, new_sequences=[new_sequence(5)],
            rows=[prefill_row(5, [0, 1])])).results[0].sampled_token_id
        first.close()
        second = StepStream(channel)
        stale = second.call(worker_pb2.StepRequest(step_id=1,
                                                   rows=[decode_row(5, len(PROMPT), token)]))
        again = second.call(worker_pb2.StepRequest(step_id=2, new_sequences=[new_sequence(5)],
                                                   rows=[prefill_row(5, [0, 1])]))
        second.close()
        assert "unknown seq_id 5" in stale.results[0].error
        assert again.results[0].sampled_token_id == token

    def test_newer_stream_supersedes_an_open_one(self, channel):
        older = StepStream(channel)
        assert not older.call(worker_pb2.StepRequest(step_id=1)).error
        newer = StepStream(channel)
        assert not newer.call(worker_pb2.StepRequest(step_id=1)).error
        assert "superseded" in older.call(worker_pb2.StepRequest(step_id=2)).error
        older.close()
        newer.close()


@pytest.mark.slow  # spawns a second rank process
def test_dead_rank_fails_steps_and_health_and_stop_leaves_no_process():
    with worker_in_thread(worker_config(), FakeRuntimeFactory()) as worker:
        with local_channel(worker.address) as channel:
            wait_for_health(channel, SERVING)
            pids = worker.running.ranks.pids
            stream = StepStream(channel)
            crashed = stream.call(worker_pb2.StepRequest(
                step_id=1, new_sequences=[new_sequence(1, [CRASH_TOKEN_ID])],
                rows=[prefill_row(1, [0], prompt=[CRASH_TOKEN_ID])]))
            later = stream.call(worker_pb2.StepRequest(step_id=2))
            stream.close()
            assert crashed.step_id == 1 and "rank 0" in crashed.error and "exited" in crashed.error
            assert later.step_id == 2 and "rank 0" in later.error
            wait_for_health(channel, NOT_SERVING, timeout_s=30)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
