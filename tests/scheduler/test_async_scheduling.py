"""Async scheduling (one step planned ahead, the worker feeding each sequence its last sampled
token, masks that follow) gives exactly the sequential loop's outputs, and leaves nothing behind.

Each scenario runs against the checking fake worker once with --async-scheduling and once without;
the fake model is a pure function of a sequence's tokens, so any token fed, discarded or masked
wrongly shows as a different output (or a violation the fake records).
"""
from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from services.scheduler.worker_connection import WorkerTimeouts
from tests.scheduler.fake_worker import FakeWorkerSpec
from tests.scheduler.grpc_harness import Harness, make_request, read_rest, running_stack
from tests.scheduler.policy_helpers import reference_output

PROMPTS = {f"plain-{i}": [5 + i, 17, 3 * i + 2, 40] for i in range(5)}
EOS_PROMPT = [9, 8, 7]
# Sampled positions among grammar-forced runs: the row planned ahead after a token that forced
# more tokens samples at the wrong position and must be discarded.
FORCED_RUNS = [[10, 11, 12], [13], [14], [20, 21], [30], [31], [32, 33]]
CONSTRAINED = {"forced-runs": FORCED_RUNS, "free-choice": [list(range(40, 60))] * 6}


def outcome(messages: list[pb.GenerateResponse]) -> tuple:
    tokens = [t for m in messages if m.HasField("tokens") for t in m.tokens.token_ids]
    finished = [m.finished for m in messages if m.HasField("finished")]
    return tokens, [(f.reason, f.completion_tokens) for f in finished]


def constraint(positions: list[list[int]]) -> pb.Constraint:
    return pb.Constraint(type=pb.CONSTRAINT_TYPE_JSON_SCHEMA, spec=json.dumps(positions))


def max_tokens(request_id: str) -> int:
    return 6 + int(request_id[-1])


EOS_AFTER = reference_output(EOS_PROMPT, 4)[3]


def eos_spec() -> FakeWorkerSpec:
    """The fake model answers EOS after the 4th token it would generate for EOS_PROMPT (and
    after that token in any sequence)."""
    return FakeWorkerSpec(eos_after_token=EOS_AFTER)


def expected_plain(prompt: list[int], limit: int) -> tuple:
    """Tokens and finish of an unconstrained request under `eos_spec` (EOS is not streamed)."""
    tokens = reference_output(prompt, limit)
    if EOS_AFTER in tokens[:-1]:
        cut = tokens.index(EOS_AFTER) + 1
        return tokens[:cut], [(pb.FINISH_REASON_STOP, cut + 1)]
    return tokens, [(pb.FINISH_REASON_LENGTH, limit)]


async def serve_mix(stack: Harness) -> dict[str, tuple]:
    calls = {rid: stack.generate(rid, prompt, max_tokens(rid)) for rid, prompt in PROMPTS.items()}
    calls["eos"] = stack.generate("eos", EOS_PROMPT, 20)
    calls.update({rid: stack.generate(rid, [7, 7, 7], 30, constraint=constraint(positions))
                  for rid, positions in CONSTRAINED.items()})
    answers = await asyncio.gather(*calls.values())
    return {rid: outcome(messages) for rid, messages in zip(calls, answers)}


def overlapped_rows(stack: Harness) -> tuple[int, int]:
    """Rows the worker fed with its last sampled token, and rows whose masks followed."""
    rows = [row for request in stack.workers[0].worker.step_requests for row in request.rows]
    return sum(r.append_last_sampled for r in rows), sum(r.mask_follows for r in rows)


def test_outputs_with_async_scheduling_equal_the_sequential_loops():
    async def run(async_scheduling: bool) -> tuple[dict[str, tuple], tuple[int, int]]:
        async with running_stack((eos_spec(),), async_scheduling=async_scheduling) as stack:
            outputs = await serve_mix(stack)
            await stack.wait_idle()
            assert not stack.workers[0].worker.violations
            return outputs, overlapped_rows(stack)

    async def scenario():
        sequential, (fed, masked) = await run(False)
        assert fed == masked == 0
        overlapped, (fed, masked) = await run(True)
        assert fed > 0 and masked > 0  # the overlapped path ran
        assert overlapped == sequential
        # The references: max_tokens, EOS, and the grammar's forced runs and termination.
        for rid, prompt in PROMPTS.items():
            assert sequential[rid] == expected_plain(prompt, max_tokens(rid))
        assert sequential["eos"] == (reference_output(EOS_PROMPT, 4), [(pb.FINISH_REASON_STOP, 5)])
        forced_tokens = sequential["forced-runs"][0]
        assert [t for t, allowed in zip(forced_tokens, FORCED_RUNS) if len(allowed) == 1] \
            == [13, 14, 30, 31]
        assert sequential["forced-runs"][1] == [(pb.FINISH_REASON_STOP, len(FORCED_RUNS) + 1)]
    asyncio.run(scenario())


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_abort_mid_stream_keeps_the_streamed_prefix_and_frees_everything(async_scheduling):
    async def scenario():
        async with running_stack(async_scheduling=async_scheduling) as stack:
            prompt = [4, 4, 2]
            call = stack.stub.Generate(make_request("long", prompt, 200))
            streamed: list[int] = []
            while len(streamed) < 5:
                message = await call.read()
                streamed += list(message.tokens.token_ids) if message.HasField("tokens") else []
            assert await stack.stub.Abort(pb.AbortRequest(request_id="long"))
            rest = await read_rest(call)
            streamed += [t for m in rest if m.HasField("tokens") for t in m.tokens.token_ids]
            assert rest[-1].finished.reason == pb.FINISH_REASON_ABORT
            assert streamed == reference_output(prompt, len(streamed))
            assert rest[-1].finished.completion_tokens == len(streamed)
            await stack.wait_idle()
            assert not stack.workers[0].worker.violations
    asyncio.run(scenario())


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_worker_lost_mid_step_fails_the_live_requests_then_serves_as_before(async_scheduling):
    async def scenario():
        timeouts = WorkerTimeouts(step_s=1.0, probe_s=1.0)
        async with running_stack(timeouts=timeouts, async_scheduling=async_scheduling) as stack:
            worker = stack.workers[0].worker
            call = stack.stub.Generate(make_request("cut", [3, 1, 4], 200))
            while not (await call.read()).HasField("tokens"):
                pass
            worker.hang.set()  # the worker stops answering with steps in flight
            with pytest.raises(grpc.aio.AioRpcError) as lost:
                await read_rest(call)
            assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
            worker.hang.clear()
            await stack.wait_ready()
            await stack.wait_idle()
            answer = outcome(await stack.generate("after", [3, 1, 4], 8))
            assert answer == (reference_output([3, 1, 4], 8), [(pb.FINISH_REASON_LENGTH, 8)])
            await stack.wait_idle()
            assert not worker.violations
    asyncio.run(scenario())


def test_preemption_under_cache_pressure_keeps_outputs_exact_with_steps_in_flight():
    """Requests preempted (and their blocks reused) while their rows are in flight."""
    spec = FakeWorkerSpec(num_blocks=24, num_window_blocks=24)
    prompts = {f"p{i}": [2 + i, 9, 4 * i + 1, 11, 6, i + 20, 3, 8] for i in range(6)}

    async def scenario():
        async with running_stack((spec,)) as stack:
            answers = await asyncio.gather(*(stack.generate(rid, prompt, 16)
                                             for rid, prompt in prompts.items()))
            state = await stack.wait_idle()
            assert not stack.workers[0].worker.violations
            assert state.preemptions_total > 0  # the pressure this test is about
            for prompt, messages in zip(prompts.values(), answers):
                assert outcome(messages) == (reference_output(prompt, 16),
                                             [(pb.FINISH_REASON_LENGTH, 16)])
    asyncio.run(scenario())
