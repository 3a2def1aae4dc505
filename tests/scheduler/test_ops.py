"""The scheduler under operations: the queue bound, the graceful drain, the correlation id.

Over gRPC against fake workers; the fake grammar's compile gate keeps constrained requests
grammar-pending for as long as a test needs.
"""
from __future__ import annotations

import asyncio

import grpc

from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from tests.scheduler.grpc_harness import make_request, read_rest, running_stack, wait_for

def json_constraint(spec: str) -> pb.Constraint:
    return pb.Constraint(type=pb.CONSTRAINT_TYPE_JSON_SCHEMA, spec=spec)


async def rpc_error(call: grpc.aio.UnaryStreamCall) -> grpc.aio.AioRpcError:
    try:
        await read_rest(call)
    except grpc.aio.AioRpcError as error:
        return error
    raise AssertionError("the call succeeded")


def test_a_full_queue_refuses_new_requests_with_unavailable_and_a_retry_hint() -> None:
    async def scenario() -> None:
        async with running_stack(max_waiting_requests=2) as stack:
            gate = asyncio.Event()
            stack.grammars[0].compile_gate = gate  # both constrained requests stay queued
            queued = [stack.stub.Generate(make_request(f"q{i}", [5, 6], 4, constraint=json_constraint("[[3]]")))
                      for i in range(2)]
            await wait_for(stack.state, lambda state: state.num_grammar_pending == 2)
            refused = await rpc_error(stack.stub.Generate(make_request("over", [7, 8], 4)))
            assert refused.code() == grpc.StatusCode.UNAVAILABLE
            assert "--max-waiting-requests 2" in refused.details()
            assert ("retry-after-s", "1") in tuple(refused.trailing_metadata())
            gate.set()
            for call in queued:
                assert (await read_rest(call))[-1].HasField("finished")
            assert (await stack.generate("after", [7, 8], 4))[-1].HasField("finished")
            await stack.wait_idle()

    asyncio.run(scenario())


def test_drain_finishes_running_requests_refuses_new_ones_and_fails_the_rest() -> None:
    async def scenario() -> None:
        async with running_stack() as stack:
            gate = asyncio.Event()
            stack.grammars[0].compile_gate = gate  # never compiles within the grace
            stuck = stack.stub.Generate(make_request("stuck", [5, 6], 4, constraint=json_constraint("[[3]]")))
            running = stack.stub.Generate(make_request("running", [8, 9, 10], 40))
            assert (await running.read()).HasField("admitted")
            await wait_for(stack.state, lambda state: state.num_grammar_pending == 1)
            drain = asyncio.create_task(stack.scheduler.drain(grace_s=2.0))
            await asyncio.sleep(0.1)
            refused = await rpc_error(stack.stub.Generate(make_request("late", [7, 8], 4)))
            assert refused.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in refused.details()
            assert (await read_rest(running))[-1].finished.completion_tokens == 40
            failed = await rpc_error(stuck)
            assert failed.code() == grpc.StatusCode.UNAVAILABLE
            assert "did not finish within the 2s shutdown grace" in failed.details()
            await drain
            await stack.wait_idle()

    asyncio.run(scenario())


def test_the_worker_gets_the_callers_request_id_with_each_new_sequence() -> None:
    async def scenario() -> list[str]:
        async with running_stack() as stack:
            call = stack.stub.Generate(make_request("chatcmpl-1", [5, 6], 2),
                                       metadata=(("x-request-id", "trace-42"),))
            await read_rest(call)
            await stack.generate("chatcmpl-2", [5, 6], 2)  # no metadata: the request id serves
            return [new.request_id for step in stack.workers[0].worker.step_requests
                    for new in step.new_sequences]

    assert asyncio.run(scenario()) == ["trace-42", "chatcmpl-2"]
