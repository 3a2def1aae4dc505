"""The worker's graceful stop: the step in flight finishes, later steps end the stream UNAVAILABLE."""
from __future__ import annotations

import asyncio

import grpc

from services.common import grpc_server
from services.common.pb.dsv4serve.v1 import worker_pb2, worker_pb2_grpc
from services.worker.server import SERVICE_NAME, WorkerServicer
from tests.worker_service.gated_ranks import GatedRanks


def test_drain_lets_the_step_in_flight_finish_then_ends_the_stream_unavailable() -> None:
    async def scenario() -> tuple[int, bool, grpc.StatusCode]:
        ranks = GatedRanks()
        started = asyncio.get_running_loop().create_future()
        started.set_result(None)
        servicer = WorkerServicer(worker_pb2.DescribeResponse(), ranks, started)
        running = await grpc_server.start_server(
            "127.0.0.1", 0, [SERVICE_NAME], lambda s: worker_pb2_grpc.add_WorkerServicer_to_server(servicer, s))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stream = worker_pb2_grpc.WorkerStub(channel).Step()
            await stream.write(worker_pb2.StepRequest(step_id=1))
            await ranks.stepping.wait()
            drain = asyncio.create_task(servicer.drain(grace_s=30))
            await asyncio.sleep(0.2)
            waited_for_the_step = not drain.done()
            ranks.gate.set()
            answered = (await stream.read()).step_id
            await drain
            await stream.write(worker_pb2.StepRequest(step_id=2))
            try:
                await stream.read()
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                code = error.code()
        await running.stop(0)
        return answered, waited_for_the_step, code

    assert asyncio.run(scenario()) == (1, True, grpc.StatusCode.UNAVAILABLE)
