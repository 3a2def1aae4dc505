"""The worker hands each step to its ranks as it arrives: under async scheduling step N+1 reaches
the ranks while N still runs, and the answers come back in order."""
from __future__ import annotations

import asyncio

import grpc

from services.common import grpc_server
from services.common.pb.dsv4serve.v1 import worker_pb2, worker_pb2_grpc
from services.worker.server import SERVICE_NAME, WorkerServicer
from tests.worker_service.gated_ranks import GatedRanks

DEADLINE_S = 30


def test_the_next_step_reaches_the_ranks_while_the_step_before_it_still_runs() -> None:
    async def scenario() -> tuple[list[int], list[int]]:
        ranks = GatedRanks()
        started = asyncio.get_running_loop().create_future()
        started.set_result(None)
        servicer = WorkerServicer(worker_pb2.DescribeResponse(), ranks, started)
        running = await grpc_server.start_server(
            "127.0.0.1", 0, [SERVICE_NAME],
            lambda s: worker_pb2_grpc.add_WorkerServicer_to_server(servicer, s))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stream = worker_pb2_grpc.WorkerStub(channel).Step()
            for step_id in (1, 2, 3):
                await stream.write(worker_pb2.StepRequest(step_id=step_id))
            async with asyncio.timeout(DEADLINE_S):
                while len(ranks.handed_over) < 3:  # no step is answered: the gate is shut
                    await asyncio.sleep(0.01)
            handed_before_an_answer = list(ranks.handed_over)
            ranks.gate.set()
            answered = [(await stream.read()).step_id for _ in range(3)]
            await stream.done_writing()
        await running.stop(0)
        return handed_before_an_answer, answered

    assert asyncio.run(scenario()) == ([1, 2, 3], [1, 2, 3])
