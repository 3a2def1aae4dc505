"""The Scheduler gRPC service against in-process fake workers: streaming, concurrency, abort and
cancellation, worker loss and return, handshake refusals, admission errors, health, reflection."""
from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.build_info import ABI_VERSION
from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from services.common.pb.dsv4serve.v1 import scheduler_pb2_grpc as pb_grpc
from services.scheduler.worker_connection import WorkerTimeouts
from tests.scheduler.fake_worker import EOS_TOKEN_ID, FakeWorkerSpec, start_fake_worker
from tests.scheduler.grpc_harness import DEADLINE_S, make_request, read_rest, running_stack, wait_for
from tests.scheduler.policy_helpers import reference_output


def tokens_of(messages: list[pb.GenerateResponse]) -> list[int]:
    return [t for m in messages if m.HasField("tokens") for t in m.tokens.token_ids]


def json_constraint(spec: str) -> pb.Constraint:
    return pb.Constraint(type=pb.CONSTRAINT_TYPE_JSON_SCHEMA, spec=spec)


def test_generate_streams_admitted_then_tokens_then_finished():
    async def scenario():
        async with running_stack() as stack:
            messages = await stack.generate("r1", [5, 6, 7, 8, 9], max_tokens=12)
            assert messages[0].admitted == pb.Admitted(prompt_tokens=5, max_tokens=12)
            assert tokens_of(messages) == reference_output([5, 6, 7, 8, 9], 12)
            assert messages[-1].finished == pb.Finished(
                reason=pb.FINISH_REASON_LENGTH, prompt_tokens=5, completion_tokens=12)
            assert not stack.workers[0].worker.violations
    asyncio.run(scenario())


def test_logit_bias_travels_once_with_the_new_sequence_and_counters_add_up():
    async def scenario():
        async with running_stack() as stack:
            request = make_request("biased", [5, 6, 7], 3)
            request.sampling.logit_bias.add(token_id=42, bias=-2.5)
            messages = [m async for m in stack.stub.Generate(request)]
            steps = stack.workers[0].worker.step_requests
            new_sequences = [n for step in steps for n in step.new_sequences]
            assert len(new_sequences) == 1
            assert list(new_sequences[0].logit_bias_token_ids) == [42]
            assert list(new_sequences[0].logit_bias_values) == [-2.5]
            state = await stack.wait_idle()
            assert state.prompt_tokens_total == 3 and state.generation_tokens_total == 3
            assert state.steps_total == len(steps)  # the last one only finishes the sequence
            assert list(steps[-1].finished_seq_ids) == [new_sequences[0].seq_id]
            assert not steps[-1].rows
            assert messages[-1].finished.completion_tokens == 3
    asyncio.run(scenario())


def test_sixteen_concurrent_requests_equal_each_alone():
    prompts = [[(7 * i + j) % 500 + 2 for j in range(3 + 5 * i)] for i in range(16)]
    lengths = [20 + 3 * i for i in range(16)]

    async def scenario():
        # A small cache and budget: queueing, chunked prefill and preemption all happen.
        spec = FakeWorkerSpec(partition_ids=(0, 1), num_blocks=40, num_window_blocks=24)
        async with running_stack((spec,), max_num_seqs=6, max_num_batched_tokens=48) as stack:
            alone = [tokens_of(await stack.generate(f"alone-{i}", p, n))
                     for i, (p, n) in enumerate(zip(prompts, lengths))]
            together = await asyncio.gather(*(stack.generate(f"together-{i}", p, n)
                                              for i, (p, n) in enumerate(zip(prompts, lengths))))
            assert [tokens_of(m) for m in together] == alone
            assert alone == [reference_output(p, n) for p, n in zip(prompts, lengths)]
            state = await stack.wait_idle()
            assert state.preemptions_total > 0
            assert not stack.workers[0].worker.violations
    asyncio.run(scenario())


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_step_time_counts_each_moment_once_and_the_workers_compute_within_it(async_scheduling):
    """With two steps in flight, a step's time starts at the previous answer, not at its send:
    the total never exceeds the time the stack was stepping, and holds the workers' compute."""
    step_s = 0.02

    async def scenario():
        async with running_stack((FakeWorkerSpec(step_s=step_s),),
                                 async_scheduling=async_scheduling) as stack:
            before = await stack.state()
            started = time.perf_counter()
            await asyncio.gather(*(stack.generate(f"r{i}", [5, 6, 7 + i], 12) for i in range(3)))
            after = await stack.wait_idle()  # the step that finishes the sequences included
            return before, after, time.perf_counter() - started

    before, after, stepping_s = asyncio.run(scenario())
    steps = after.steps_total - before.steps_total
    forward_s = after.worker_forward_seconds_total - before.worker_forward_seconds_total
    step_time_s = after.step_seconds_total - before.step_seconds_total
    assert forward_s == pytest.approx(steps * step_s)
    assert forward_s <= step_time_s <= stepping_s


@pytest.mark.parametrize("described_bound, most_running", [(2, 2), (0, 5)])
def test_runs_no_more_sequences_than_the_worker_sized_its_drafter_state_for(described_bound,
                                                                            most_running):
    """A DSpark worker takes its per-sequence windows for --max-num-seqs from its cache memory
    and describes that bound: the scheduler's own (larger) --max-num-seqs yields to it."""
    prompts = [[i + 2, i + 3, i + 4] for i in range(5)]

    async def scenario():
        spec = FakeWorkerSpec(max_num_seqs=described_bound)
        async with running_stack((spec,), max_num_seqs=8) as stack:
            outputs = await asyncio.gather(*(stack.generate(f"r{i}", p, 6)
                                             for i, p in enumerate(prompts)))
            assert [tokens_of(m) for m in outputs] == [reference_output(p, 6) for p in prompts]
            steps = stack.workers[0].worker.step_requests
            assert max(len(step.rows) for step in steps) == most_running
    asyncio.run(scenario())


def test_two_workers_each_get_only_their_partitions_rows():
    prompts = [[i + 2, i + 3, i + 4] for i in range(8)]

    async def scenario():
        specs = (FakeWorkerSpec(partition_ids=(0,), dp=2), FakeWorkerSpec(partition_ids=(1,), dp=2))
        async with running_stack(specs) as stack:
            outputs = await asyncio.gather(*(stack.generate(f"r{i}", p, 10)
                                             for i, p in enumerate(prompts)))
            assert [tokens_of(m) for m in outputs] == [reference_output(p, 10) for p in prompts]
            await stack.wait_idle()
            for fake in stack.workers:
                assert not fake.worker.violations
                assert any(r.rows for r in fake.worker.step_requests)  # both partitions used
    asyncio.run(scenario())


def test_abort_and_cancel_release_everything():
    async def scenario():
        async with running_stack() as stack:
            gate = asyncio.Event()
            stack.grammars[0].compile_gate = gate  # keep the constrained one grammar-pending
            aborted = stack.stub.Generate(make_request("aborted", [5, 6, 7], 400))
            cancelled = stack.stub.Generate(make_request("cancelled", [8, 9, 10], 400))
            pending = stack.stub.Generate(make_request("pending", [5, 6], 10,
                                                       constraint=json_constraint("[[3]]")))
            for call in (aborted, cancelled):
                assert (await call.read()).HasField("admitted")
                assert (await call.read()).HasField("tokens")
            state = await stack.state()
            assert state.num_running == 2 and state.num_grammar_pending == 1
            reply = await stack.stub.Abort(pb.AbortRequest(request_id="aborted"))
            assert reply.found
            cancelled.cancel()
            pending.cancel()
            rest = await read_rest(aborted)
            assert rest[-1].finished.reason == pb.FINISH_REASON_ABORT
            await stack.wait_idle()
            await wait_for(stack.state, lambda s: not stack.workers[0].worker.live)
            assert not (await stack.stub.Abort(pb.AbortRequest(request_id="aborted"))).found
            gate.set()
            assert stack.grammars[0].live_matchers == 0
    asyncio.run(scenario())


def test_worker_killed_then_restarted():
    async def scenario():
        async with running_stack() as stack:
            call = stack.stub.Generate(make_request("long", [5, 6, 7], 500))
            assert (await call.read()).HasField("admitted")
            assert (await call.read()).HasField("tokens")
            port = stack.workers[0].port
            await stack.workers[0].stop()
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await read_rest(call)
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "worker" in failure.value.details()
            not_ready = await stack.wait_ready(False)
            assert not_ready.reason and not not_ready.workers[0].connected
            stack.workers[0] = await start_fake_worker(FakeWorkerSpec(), port=port)
            await stack.wait_ready(True)
            messages = await stack.generate("after", [5, 6, 7], 8)
            assert tokens_of(messages) == reference_output([5, 6, 7], 8)
            await stack.wait_idle()
    asyncio.run(scenario())


def test_hung_worker_fails_requests_after_the_step_timeout_then_recovers():
    async def scenario():
        timeouts = WorkerTimeouts(step_s=0.5, probe_s=0.5)
        async with running_stack(timeouts=timeouts) as stack:
            stack.workers[0].worker.hang.set()
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stack.generate("stuck", [5, 6, 7], 5)
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "did not answer step" in failure.value.details()
            stack.workers[0].worker.hang.clear()
            await stack.wait_ready()
            messages = await stack.generate("unstuck", [5, 6, 7], 5)
            assert tokens_of(messages) == reference_output([5, 6, 7], 5)
    asyncio.run(scenario())


def test_worker_reporting_not_serving_mid_step_fails_requests_and_the_loop_survives():
    async def scenario():
        async with running_stack() as stack:
            fake = stack.workers[0]
            fake.worker.hang.set()  # the step stays in flight while the probe sees NOT_SERVING
            call = stack.stub.Generate(make_request("in-flight", [5, 6, 7], 5))
            assert (await call.read()).HasField("admitted")
            await fake.set_serving(False)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await read_rest(call)
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "not serving" in failure.value.details()
            fake.worker.hang.clear()
            await fake.set_serving(True)
            await stack.wait_ready()
            messages = await stack.generate("after", [5, 6, 7], 5)
            assert tokens_of(messages) == reference_output([5, 6, 7], 5)
    asyncio.run(scenario())


async def first_abandoned_state_query(stack) -> grpc.StatusCode:
    """Query the state with a short deadline until one query is not answered; its status."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        try:
            await stack.stub.GetSchedulerState(pb.GetSchedulerStateRequest(), timeout=0.2)
        except grpc.aio.AioRpcError as error:
            return error.code()
    raise AssertionError("every state query was answered while the worker hung")


def test_state_query_abandoned_while_a_step_is_in_flight_does_not_break_the_loop():
    async def scenario():
        timeouts = WorkerTimeouts(step_s=1.0, probe_s=1.0)
        async with running_stack(timeouts=timeouts) as stack:
            stack.workers[0].worker.hang.set()
            call = stack.stub.Generate(make_request("stuck", [5, 6, 7], 5))
            assert (await call.read()).HasField("admitted")
            # Queries are answered between steps until the loop awaits the hung step's answer.
            assert await first_abandoned_state_query(stack) == grpc.StatusCode.DEADLINE_EXCEEDED
            with pytest.raises(grpc.aio.AioRpcError):
                await read_rest(call)
            stack.workers[0].worker.hang.clear()
            await stack.wait_ready()
            assert tokens_of(await stack.generate("next", [5, 6], 3)) == reference_output([5, 6], 3)
    asyncio.run(scenario())


def test_abi_mismatch_is_refused_with_both_versions():
    async def scenario():
        spec = FakeWorkerSpec(abi_version=ABI_VERSION + 98)
        async with running_stack((spec,), wait_ready=False) as stack:
            ready = await wait_for(lambda: stack.stub.CheckReady(pb.CheckReadyRequest()),
                                   lambda r: "refused" in r.reason)
            assert not ready.ready
            assert f"ABI version is {ABI_VERSION + 98}" in ready.reason
            assert f"ABI version is {ABI_VERSION} " in ready.reason
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stack.generate("r", [5, 6], 3)
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    asyncio.run(scenario())


def test_worker_that_is_not_serving_yet_keeps_the_scheduler_not_ready():
    async def scenario():
        async with running_stack((FakeWorkerSpec(serving=False),), wait_ready=False) as stack:
            ready = await wait_for(lambda: stack.stub.CheckReady(pb.CheckReadyRequest()),
                                   lambda r: "not serving yet" in r.reason)
            assert not ready.ready and not ready.workers[0].connected
    asyncio.run(scenario())


def test_fingerprint_mismatch_with_the_first_worker_is_refused():
    async def scenario():
        specs = (FakeWorkerSpec(partition_ids=(0,), dp=2),
                 FakeWorkerSpec(partition_ids=(1,), dp=2, fingerprint="sha256:other-model"))
        async with running_stack(specs, wait_ready=False) as stack:
            ready = await wait_for(lambda: stack.stub.CheckReady(pb.CheckReadyRequest()),
                                   lambda r: "fingerprint" in r.reason)
            assert "sha256:other-model" in ready.reason and "sha256:fake-model" in ready.reason
    asyncio.run(scenario())


def test_workers_with_different_block_capacity_are_refused():
    async def scenario():
        specs = (FakeWorkerSpec(partition_ids=(0,), dp=2),
                 FakeWorkerSpec(partition_ids=(1,), dp=2, num_blocks=99))
        async with running_stack(specs, wait_ready=False) as stack:
            ready = await wait_for(lambda: stack.stub.CheckReady(pb.CheckReadyRequest()),
                                   lambda r: "block groups" in r.reason)
            assert not ready.ready and "num_blocks=99" in ready.reason
    asyncio.run(scenario())


def test_admission_errors_are_invalid_argument_naming_the_problem():
    async def scenario():
        async with running_stack(max_model_len=64) as stack:
            with pytest.raises(grpc.aio.AioRpcError) as too_long:
                await stack.generate("long", list(range(2, 66)), 4)
            assert too_long.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = too_long.value.details()
            assert "64 tokens" in details and "max_model_len is 64" in details
            with pytest.raises(grpc.aio.AioRpcError) as empty:
                await stack.generate("empty", [], 4)
            assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as bad_grammar:
                await stack.generate("bad", [5, 6], 4, constraint=json_constraint("{not json"))
            assert bad_grammar.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "does not compile" in bad_grammar.value.details()
            capped = await stack.generate("capped", list(range(2, 62)), 100)
            assert capped[0].admitted.max_tokens == 4 and capped[0].admitted.max_tokens_capped
            assert capped[-1].finished.hit_max_model_len
            await stack.wait_idle()
    asyncio.run(scenario())


def test_constrained_request_follows_the_grammar_and_releases_its_matcher():
    async def scenario():
        async with running_stack() as stack:
            spec = json.dumps([[3, 4], [20], [21], [30, 31]])
            messages = await stack.generate("c", [5, 6, 7], 50, constraint=json_constraint(spec))
            assert messages[0].admitted.constrained
            streamed = tokens_of(messages)
            assert streamed[0] in (3, 4) and streamed[1:3] == [20, 21] and streamed[3] in (30, 31)
            assert messages[-1].finished.reason == pb.FINISH_REASON_STOP
            assert messages[-1].finished.completion_tokens == 5  # EOS counted, not streamed
            assert EOS_TOKEN_ID not in streamed
            await stack.wait_idle()
    asyncio.run(scenario())


def test_state_counts_a_running_constrained_request_until_it_is_cancelled():
    async def scenario():
        async with running_stack() as stack:
            free_text = json.dumps([[3, 4, 5]] * 400)
            call = stack.stub.Generate(make_request("c", [5, 6, 7], 300,
                                                    constraint=json_constraint(free_text)))
            assert (await call.read()).admitted.constrained
            assert (await call.read()).HasField("tokens")
            state = await stack.state()
            assert state.num_constrained_running == 1 and state.num_live_matchers == 1
            assert state.grammar_cache_entries == 1
            summary = state.requests[0]
            assert summary.constrained and summary.phase == pb.REQUEST_PHASE_RUNNING
            query = pb.GetRequestStateRequest(request_id="c")
            assert (await stack.stub.GetRequestState(query)).grammar_status == "ready"
            call.cancel()
            await stack.wait_idle()
    asyncio.run(scenario())


def test_without_xgrammar_constrained_requests_are_refused_and_others_work():
    async def scenario():
        async with running_stack(grammar_available=False) as stack:
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stack.generate("c", [5, 6], 4, constraint=json_constraint("[[3]]"))
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "XGrammar" in failure.value.details()
            assert tokens_of(await stack.generate("u", [5, 6], 4)) == reference_output([5, 6], 4)
            info = await stack.stub.GetModelInfo(pb.GetModelInfoRequest())
            assert not info.constrained_decoding_available and info.served_model_name == "fake-v4"
    asyncio.run(scenario())


def test_request_state_shows_tokens_and_block_tables():
    async def scenario():
        async with running_stack() as stack:
            call = stack.stub.Generate(make_request("watched", list(range(2, 30)), 300))
            await call.read()
            await call.read()
            query = pb.GetRequestStateRequest(request_id="watched")
            state = await stack.stub.GetRequestState(query)
            assert state.summary.phase == pb.REQUEST_PHASE_RUNNING
            assert list(state.prompt_token_ids) == list(range(2, 30)) and state.max_tokens == 300
            tables = {t.group: t for t in state.block_tables}
            assert len(tables["compressed"].block_ids) * 4 >= state.summary.computed_tokens
            assert tables["window"].released_prefix > 0
            call.cancel()
            await stack.wait_idle()
    asyncio.run(scenario())


def test_serve_sets_started_and_stops_when_cancelled():
    from services.scheduler.server import serve
    from tests.scheduler.grpc_harness import free_port, scheduler_config

    async def scenario():
        fake = await start_fake_worker(FakeWorkerSpec())
        port = free_port()
        started = asyncio.Event()
        task = asyncio.create_task(serve(scheduler_config((fake.address,), port=port),
                                         started=started))
        try:
            await asyncio.wait_for(started.wait(), 20)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = pb_grpc.SchedulerStub(channel)
                ready = await wait_for(lambda: stub.CheckReady(pb.CheckReadyRequest()),
                                       lambda r: r.ready)
                assert ready.workers[0].address == fake.address
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await fake.stop()
        assert task.done()
    asyncio.run(scenario())


def test_health_and_reflection_list_the_services():
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async def scenario():
        async with running_stack() as stack:
            health = health_pb2_grpc.HealthStub(stack.channel)
            check = health_pb2.HealthCheckRequest(service="dsv4serve.v1.Scheduler")
            status = await wait_for(lambda: health.Check(check),
                                    lambda r: r.status == health_pb2.HealthCheckResponse.SERVING)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            reflection = reflection_pb2_grpc.ServerReflectionStub(stack.channel)
            call = reflection.ServerReflectionInfo()
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            answer = await call.read()
            await call.done_writing()
            names = {s.name for s in answer.list_services_response.service}
            assert {"dsv4serve.v1.Scheduler", "grpc.health.v1.Health"} <= names
    asyncio.run(scenario())


def test_state_rpc_shows_prefix_cache_hits_and_cached_blocks_per_partition():
    system = [(11 * j) % 500 + 2 for j in range(24)]

    async def scenario():
        async with running_stack() as stack:
            first = await stack.generate("first", system + [3, 4], 4)
            second = await stack.generate("second", system + [5, 6, 7], 4)
            assert tokens_of(first) == reference_output(system + [3, 4], 4)
            assert tokens_of(second) == reference_output(system + [5, 6, 7], 4)
            state = await stack.wait_idle()
            assert state.prefix_caching_enabled
            partition = state.partitions[0]
            assert (partition.prefix_cache_queries, partition.prefix_cache_hits) == (26 + 27, 24)
            assert partition.prefix_cache_hit_rate == pytest.approx(24 / 53)
            assert (state.prefix_cache_queries_total, state.prefix_cache_hits_total) == (53, 24)
            assert all(g.cached_blocks > 0 and g.used_blocks == 0 for g in partition.groups)
            assert not stack.workers[0].worker.violations
    asyncio.run(scenario())
