"""An in-process scheduler over in-process fake workers, and a client for it."""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Optional

import grpc

from services import launcher
from services.common.config import SchedulerConfig
from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from services.common.pb.dsv4serve.v1 import scheduler_pb2_grpc
from services.scheduler.server import RunningScheduler, start_scheduler_server
from services.scheduler.worker_connection import WorkerTimeouts
from tests.scheduler.fake_grammar import FakeGrammarService
from tests.scheduler.fake_worker import FakeWorkerSpec, RunningFakeWorker, start_fake_worker

DEADLINE_S = 20.0


@dataclass
class Harness:
    scheduler: RunningScheduler
    workers: list[RunningFakeWorker]
    stub: scheduler_pb2_grpc.SchedulerStub
    channel: grpc.aio.Channel
    grammars: list[FakeGrammarService] = field(default_factory=list)

    async def generate(self, request_id: str, prompt: list[int], max_tokens: Optional[int] = None,
                       **fields) -> list[pb.GenerateResponse]:
        return [m async for m in self.stub.Generate(make_request(request_id, prompt, max_tokens,
                                                                 **fields))]

    async def state(self) -> pb.GetSchedulerStateResponse:
        return await self.stub.GetSchedulerState(pb.GetSchedulerStateRequest(include_requests=True))

    async def wait_ready(self, ready: bool = True) -> pb.CheckReadyResponse:
        return await wait_for(lambda: self.stub.CheckReady(pb.CheckReadyRequest()),
                              lambda r: r.ready == ready)

    async def wait_idle(self) -> pb.GetSchedulerStateResponse:
        """Idle numbers: no request anywhere, every block free, no matcher, worker holds nothing."""
        def idle(state: pb.GetSchedulerStateResponse) -> bool:
            return (state.num_running == state.num_waiting == state.num_grammar_pending == 0
                    and state.num_live_matchers == 0 and not state.requests
                    and all(g.free_blocks == g.total_blocks
                            for p in state.partitions for g in p.groups))
        return await wait_for(self.state, idle)


def make_request(request_id: str, prompt: list[int], max_tokens: Optional[int] = None, *,
                 constraint: Optional[pb.Constraint] = None,
                 ignore_eos: bool = False) -> pb.GenerateRequest:
    sampling = pb.SamplingParams(ignore_eos=ignore_eos)
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    return pb.GenerateRequest(request_id=request_id, prompt_token_ids=prompt, sampling=sampling,
                              constraint=constraint)


async def read_rest(call: grpc.aio.UnaryStreamCall) -> list[pb.GenerateResponse]:
    """The remaining messages of a stream already read with `read()`; raises its error status."""
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


async def wait_for(fetch: Callable[[], Awaitable], done: Callable[[object], bool],
                   deadline_s: float = DEADLINE_S):
    """Fetch until `done(value)`; fails with the last value after the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        value = await fetch()
        if done(value):
            return value
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {deadline_s}s; last value:\n{value}")
        await asyncio.sleep(0.02)


def free_port() -> int:
    """A free port below the kernel's ephemeral range (launcher.bind_auto_port): no outgoing
    connection can take it before the service under test binds it."""
    with launcher.bind_auto_port("127.0.0.1") as sock:
        return sock.getsockname()[1]


def scheduler_config(addresses: tuple[str, ...], **overrides) -> SchedulerConfig:
    base = SchedulerConfig(model_dir=Path("/nonexistent"), served_model_name="fake-v4",
                           worker_addresses=addresses, port=0, max_model_len=512, block_size=4,
                           max_num_seqs=8, max_num_batched_tokens=256,
                           long_prefill_token_threshold=16, worker_probe_interval_s=0.1)
    return replace(base, **overrides)


@contextlib.asynccontextmanager
async def running_stack(specs: tuple[FakeWorkerSpec, ...] = (FakeWorkerSpec(),), *,
                        wait_ready: bool = True, grammar_available: bool = True,
                        expected_fingerprint: Optional[str] = None,
                        timeouts: WorkerTimeouts = WorkerTimeouts(step_s=5.0, probe_s=2.0),
                        **config_overrides) -> AsyncIterator[Harness]:
    workers = [await start_fake_worker(spec) for spec in specs]
    grammars: list[FakeGrammarService] = []

    def grammar_factory(description):
        grammars.append(FakeGrammarService(description.eos_token_id, grammar_available))
        return grammars[-1]

    config = scheduler_config(tuple(w.address for w in workers), **config_overrides)
    scheduler = await start_scheduler_server(config, grammar=grammar_factory,
                                             expected_fingerprint=expected_fingerprint,
                                             timeouts=timeouts)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{scheduler.port}")
    harness = Harness(scheduler, workers, scheduler_pb2_grpc.SchedulerStub(channel), channel,
                      grammars)
    try:
        if wait_ready:
            await harness.wait_ready()
        yield harness
    finally:
        await channel.close()
        await scheduler.stop(0)
        for worker in harness.workers:
            await worker.stop()
