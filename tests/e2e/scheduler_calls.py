"""Token-level calls to a running stack's scheduler (gRPC Generate with prompt token ids), and the
counters end-to-end tests read around them."""
from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Optional

import grpc

from services.common.config import TlsConfig
from services.common.grpc_channels import blocking_channel
from services.common.pb.dsv4serve.v1 import scheduler_pb2 as pb
from services.common.pb.dsv4serve.v1 import scheduler_pb2_grpc
from tests.e2e.helpers import scheduler_state

# A small JSON object grammar: constrained requests in the pressure tests.
OBJECT_SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"},
                                                             "b": {"type": "string"}},
                            "required": ["a", "b"], "additionalProperties": False})


def random_prompt(seed: int, length: int) -> list[int]:
    """Ordinary (non-special) token ids of the V4 vocabulary."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 100_000) for _ in range(length)]


@dataclass(frozen=True)
class Call:
    request_id: str
    prompt: list[int]
    max_tokens: int
    constrained: bool = False

    def message(self) -> pb.GenerateRequest:
        constraint = (pb.Constraint(type=pb.CONSTRAINT_TYPE_JSON_SCHEMA, spec=OBJECT_SCHEMA)
                      if self.constrained else None)
        return pb.GenerateRequest(
            request_id=self.request_id, prompt_token_ids=self.prompt, constraint=constraint,
            sampling=pb.SamplingParams(max_tokens=self.max_tokens, ignore_eos=not self.constrained))


def generate(address: str, call: Call) -> list[int]:
    """The request's output tokens (its stream must end with `finished`)."""
    with blocking_channel(address, TlsConfig()) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        tokens: list[int] = []
        finished: Optional[pb.Finished] = None
        for message in stub.Generate(call.message(), timeout=600):
            if message.HasField("tokens"):
                tokens.extend(message.tokens.token_ids)
            if message.HasField("finished"):
                finished = message.finished
        assert finished is not None, f"{call.request_id} ended without finishing"
        return tokens


def hits_of(address: str, call: Call) -> tuple[list[int], int]:
    """Generate; returns (tokens, prefix-cache hit tokens the request added)."""
    before = scheduler_state(address).prefix_cache_hits_total
    tokens = generate(address, call)
    return tokens, scheduler_state(address).prefix_cache_hits_total - before


async def cancelled_streams(address: str, calls: list[Call], seed: int) -> None:
    """Start every call at once and cancel each after a random 0..1 s, or after its first tokens."""
    rng = random.Random(seed)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)

        async def one(call: Call, delay_s: float) -> None:
            stream = stub.Generate(call.message(), timeout=600)
            try:
                await asyncio.wait_for(stream.read(), delay_s)  # admitted, or not yet
                await asyncio.wait_for(stream.read(), delay_s)  # a first token, or not yet
            except (asyncio.TimeoutError, grpc.aio.AioRpcError):
                pass
            stream.cancel()
        await asyncio.gather(*(one(call, rng.random()) for call in calls))


def referenced_blocks(state: pb.GetSchedulerStateResponse) -> int:
    return sum(g.used_blocks for p in state.partitions for g in p.groups)


def cached_blocks(state: pb.GetSchedulerStateResponse) -> int:
    return sum(g.cached_blocks for p in state.partitions for g in p.groups)
