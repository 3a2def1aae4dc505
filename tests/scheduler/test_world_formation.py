"""Several workers forming one world, against in-process fake workers: their ranks must cover the
world exactly once with one topology, and the scheduler forms the world (JoinWorld) before the first
step and again after it lost a worker."""
from __future__ import annotations

import asyncio

from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from tests.scheduler.fake_worker import FakeWorkerSpec, start_fake_worker
from tests.scheduler.grpc_harness import running_stack, wait_for


def refusal(specs: tuple[FakeWorkerSpec, ...], expected: str) -> str:
    async def scenario() -> str:
        async with running_stack(specs, wait_ready=False) as stack:
            ready = await wait_for(lambda: stack.stub.CheckReady(pb.CheckReadyRequest()),
                                   lambda r: expected in r.reason)
            assert not ready.ready
            assert not any(fake.worker.joined_rounds for fake in stack.workers)
            return ready.reason
    return asyncio.run(scenario())


def test_two_workers_driving_the_same_rank_are_refused():
    reason = refusal((FakeWorkerSpec(partition_ids=(0,), dp=2),
                      FakeWorkerSpec(partition_ids=(0,), dp=2)), "also driven by")
    assert "rank 0" in reason


def test_a_rank_no_worker_drives_is_refused():
    reason = refusal((FakeWorkerSpec(partition_ids=(0,), dp=3),
                      FakeWorkerSpec(partition_ids=(1,), dp=3)), "driven by no worker")
    assert "ranks 2 of the 3-rank world" in reason


def test_workers_of_different_topologies_are_refused():
    reason = refusal((FakeWorkerSpec(partition_ids=(0,), dp=2),
                      FakeWorkerSpec(partition_ids=(1,), dp=3)), "topology")
    assert "dp2" in reason and "dp3" in reason


def test_the_world_is_formed_before_the_first_step_and_again_after_a_worker_returns():
    async def scenario():
        specs = (FakeWorkerSpec(partition_ids=(0,), dp=2), FakeWorkerSpec(partition_ids=(1,), dp=2))
        async with running_stack(specs) as stack:
            assert [fake.worker.joined_rounds for fake in stack.workers] == [[1], [1]]
            port = stack.workers[1].port
            await stack.workers[1].stop()
            await stack.wait_ready(False)
            stack.workers[1] = await start_fake_worker(specs[1], port=port)
            await stack.wait_ready(True)
            # The survivor joins the new round too: its old collectives may wait on the lost peer.
            assert stack.workers[0].worker.joined_rounds == [1, 2]
            assert stack.workers[1].worker.joined_rounds == [2]
            await stack.generate("after", [5, 6, 7], 4)
    asyncio.run(scenario())


def test_a_worker_restarted_between_two_probes_is_noticed_and_the_world_formed_again():
    """The restart is over before any probe could see the worker gone: only its new identity
    (instance id, world round 0) tells the scheduler that the Step stream and world it had are
    gone."""
    async def scenario():
        specs = (FakeWorkerSpec(partition_ids=(0,), dp=2), FakeWorkerSpec(partition_ids=(1,), dp=2))
        async with running_stack(specs, worker_probe_interval_s=3600.0) as stack:
            port = stack.workers[1].port
            await stack.workers[1].stop()
            stack.workers[1] = await start_fake_worker(specs[1], port=port)
            await stack.wait_ready(True)
            assert stack.workers[0].worker.joined_rounds == [1, 2]
            assert stack.workers[1].worker.joined_rounds == [2]
            await stack.generate("after", [5, 6, 7], 4)
    asyncio.run(scenario())


def test_a_failed_formation_is_retried_under_a_new_round_number():
    """The failed attempt's ranks left their addresses under its round in the world's store: a
    retry under the same number would rendezvous with them."""
    async def scenario():
        specs = (FakeWorkerSpec(partition_ids=(0,), dp=2, join_failures=1),
                 FakeWorkerSpec(partition_ids=(1,), dp=2, join_failures=1))
        async with running_stack(specs) as stack:
            assert [fake.worker.join_attempts for fake in stack.workers] == [[1, 2], [1, 2]]
            assert [fake.worker.joined_rounds for fake in stack.workers] == [[2], [2]]
            await stack.generate("after", [5, 6, 7], 4)
    asyncio.run(scenario())
