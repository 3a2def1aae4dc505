"""The guide's topology over two workers: dp4 × tp4 attention, ep16 experts, ranks 0–7 in one worker
process and 8–15 in another, one scheduler, one frontend — real processes, the tiny-ep16 preset.

One deployment for the module; the tests run in file order and the last one kills a worker.
Outputs are held to the single-rank run of the same checkpoint (`layout_run`, one rank process).
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Iterator

import grpc
import httpx
import pytest
import torch

from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from services.common.pb.dsv4serve.v1 import scheduler_pb2_grpc
from services.worker.model.layout_run import Workload, run_layout
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint
from tests.e2e.deployment import NAME, Deployment
from tests.e2e.helpers import describe_usage, is_idle, scheduler_state, wait_for

pytestmark = pytest.mark.slow

GUIDE_TOPOLOGY = ("--dp", "4", "--tp", "4", "--ep", "16")
PROMPT_LENGTHS = (5, 37, 130, 256, 300, 411, 520, 600)


@pytest.fixture(scope="module")
def ep16_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-ep16"), preset="tiny-ep16", seed=1)


@pytest.fixture(scope="module")
def deployment(ep16_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> Iterator[Deployment]:
    log_dir = tmp_path_factory.mktemp("ep16-logs")
    with Deployment(ep16_model_dir, log_dir, GUIDE_TOPOLOGY, ("0-7", "8-15"),
                    ("--max-model-len", "2048", "--max-num-batched-tokens", "2048")) as running:
        failed_before = request.session.testsfailed
        if not running.wait_healthy():
            pytest.fail(f"the two-worker deployment did not become healthy\n{running.logs()}")
        yield running
        if request.session.testsfailed > failed_before:
            print(running.logs())


def random_prompts(lengths: tuple[int, ...], seed: int) -> tuple[tuple[int, ...], ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(tuple(torch.randint(2, 129_000, (n,), generator=generator).tolist())
                 for n in lengths)


def single_rank_tokens(model_dir: Path, prompts: tuple[tuple[int, ...], ...],
                       num_tokens: int) -> list[list[int]]:
    run = run_layout(model_dir, 1, 1, 1, Workload(prompts, num_tokens))
    return [run.outputs[i].tokens for i in range(len(prompts))]


async def generate(address: str, prompts: tuple[tuple[int, ...], ...], max_tokens: int,
                   tag: str) -> list[list[int]]:
    """Every prompt through Scheduler.Generate at once (greedy, EOS ignored) → output token ids."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)

        async def one(i: int, prompt: tuple[int, ...]) -> list[int]:
            request = pb.GenerateRequest(
                request_id=f"{tag}-{i}", prompt_token_ids=prompt,
                sampling=pb.SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            return [t async for m in stub.Generate(request) if m.HasField("tokens")
                    for t in m.tokens.token_ids]
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def test_two_workers_of_eight_ranks_give_the_single_rank_tokens(deployment, ep16_model_dir):
    prompts = random_prompts(PROMPT_LENGTHS, seed=0)
    served = asyncio.run(generate(deployment.scheduler_address, prompts, 24, "guide"))
    assert served == single_rank_tokens(ep16_model_dir, prompts, 24)
    assert wait_for(lambda: is_idle(scheduler_state(deployment.scheduler_address)), 30)


def test_32_concurrent_requests_use_every_partition_and_each_gets_its_own_tokens(
        deployment, ep16_model_dir):
    prompts = random_prompts(tuple(20 + 3 * i for i in range(32)), seed=1)
    busy_partitions: set[int] = set()

    async def run_and_watch() -> list[list[int]]:
        served = asyncio.ensure_future(generate(deployment.scheduler_address, prompts, 8, "many"))
        while not served.done():
            state = await asyncio.to_thread(scheduler_state, deployment.scheduler_address)
            busy_partitions.update(p.partition_id for p in state.partitions
                                   if p.running_requests)
            await asyncio.sleep(0.05)
        return served.result()

    served = asyncio.run(run_and_watch())
    assert busy_partitions == {0, 1, 2, 3}
    assert served == single_rank_tokens(ep16_model_dir, prompts, 8)
    state = scheduler_state(deployment.scheduler_address)
    assert wait_for(lambda: is_idle(scheduler_state(deployment.scheduler_address)), 30), \
        describe_usage(state)


def test_a_decode_in_one_partition_is_untouched_by_a_long_prefill_in_another(deployment):
    """A decodes in partition 0 while B prefills 1,500 tokens in partition 1 (2 and 3 idle): A's
    tokens equal A alone, and B's blocks are in partition 1 only."""
    prompt_a, prompt_b = random_prompts((40, 1500), seed=2)
    alone = asyncio.run(generate(deployment.scheduler_address, (prompt_a,), 24, "alone"))[0]
    usage_during_b: list[pb.GetSchedulerStateResponse] = []

    async def both() -> list[int]:
        a = asyncio.ensure_future(generate(deployment.scheduler_address, (prompt_a,), 24, "a"))
        address = deployment.scheduler_address
        await _until(address, lambda s: s.num_running == 1 and _output_tokens(s, "a-0") >= 4, a)
        b = asyncio.ensure_future(generate(address, (prompt_b,), 1, "b"))
        usage_during_b.append(await _until(address, lambda s: _computed(s, "b-0") > 0, a))
        await b
        return (await a)[0]

    assert asyncio.run(both()) == alone
    state = usage_during_b[0]
    requests = {r.request_id: r for r in state.requests}
    assert (requests["a-0"].partition_id, requests["b-0"].partition_id) == (0, 1)
    used = {p.partition_id: sum(g.used_blocks for g in p.groups) for p in state.partitions}
    assert used[1] > 0 and used[2] == used[3] == 0


def test_killing_a_worker_fails_streams_with_an_error_event_and_its_restart_recovers(
        deployment):
    prompt = list(random_prompts((30,), seed=3)[0])
    body = {"model": NAME, "prompt": prompt, "max_tokens": 1500, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=deployment.base_url, timeout=120, trust_env=False) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            deployment.kill("worker1")
            killed = time.monotonic()
            rest = [line[len("data: "):] for line in lines if line.startswith("data: ")]
        assert rest[-1] == "[DONE]" and "error" in json.loads(rest[-2]), rest[-3:]
        assert deployment.wait_healthy(503, timeout_s=5.0)
        assert time.monotonic() - killed < 5.0 + 1.0
        deployment.start_worker(1)
        assert deployment.wait_healthy(200)
        answer = http.post("/v1/completions", json={**body, "max_tokens": 4, "stream": False})
        assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] == "length"


def _output_tokens(state: pb.GetSchedulerStateResponse, request_id: str) -> int:
    return next((r.output_tokens for r in state.requests if r.request_id == request_id), 0)


def _computed(state: pb.GetSchedulerStateResponse, request_id: str) -> int:
    return next((r.computed_tokens for r in state.requests if r.request_id == request_id), 0)


async def _until(address: str, condition, running: asyncio.Future) -> pb.GetSchedulerStateResponse:
    """The first scheduler state (with requests) that satisfies `condition` while `running` is not
    done yet; a failure, not a hang, when it finishes first."""
    while True:
        assert not running.done(), "the decode finished before the state the test waits for"
        state = await asyncio.to_thread(scheduler_state, address, True)
        if condition(state):
            return state
        await asyncio.sleep(0.02)
