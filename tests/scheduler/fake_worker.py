"""An in-process fake Worker: checks every step descriptor it receives and "samples" a
deterministic function of each sequence's tokens, so scheduler tests can compare outputs exactly.

Checks (each failure is recorded in `violations` and answered as a row error): a NewSequence is new
and in a partition this worker holds; rows start where the sequence's cache ends (positions
contiguous); a row's tokens are all known; both block tables cover the row; no compressed block is
in two live sequences' tables; no window block still inside a live sequence's window is handed to
another sequence; rows sample exactly when they reach the sequence's last token; masks are obeyed.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from services.common.build_info import ABI_VERSION
from services.common.pb.dsv4serve.v1 import worker_pb2, worker_pb2_grpc

VOCAB_SIZE = 512
EOS_TOKEN_ID = 1
FINGERPRINT = "sha256:fake-model"


def next_token(tokens: list[int]) -> int:
    """The fake model: a token in [2, VOCAB_SIZE) from the last tokens and the length."""
    mix = sum((i + 1) * t for i, t in enumerate(tokens[-16:]))
    return (mix * 7919 + len(tokens) * 31) % (VOCAB_SIZE - 2) + 2


@dataclass
class FakeWorkerSpec:
    # One rank per partition (tp 1): the worker drives ranks == its partitions of a dp-rank world.
    partition_ids: tuple[int, ...] = (0,)
    dp: Optional[int] = None  # None: len(partition_ids), the worker drives the whole world
    block_size: int = 4
    num_blocks: int = 256
    num_window_blocks: int = 64
    sliding_window: int = 8
    max_num_batched_tokens: int = 8192
    abi_version: int = ABI_VERSION
    fingerprint: str = FINGERPRINT
    serving: bool = True  # its grpc.health.v1 status
    # When set, the fake model answers EOS right after this token.
    eos_after_token: Optional[int] = None


@dataclass
class _Sequence:
    partition_id: int
    tokens: list[int]
    num_cached: int = 0
    blocks: list[int] = field(default_factory=list)
    window_blocks: list[int] = field(default_factory=list)


class FakeWorker(worker_pb2_grpc.WorkerServicer):
    def __init__(self, spec: FakeWorkerSpec) -> None:
        self.spec = spec
        self.violations: list[str] = []
        self.step_requests: list[worker_pb2.StepRequest] = []
        self.hang = asyncio.Event()  # set: stop answering steps (a hung worker)
        self.live: dict[int, _Sequence] = {}
        self.ended: set[int] = set()  # sequences of this worker already finished
        self.dp = spec.dp or len(spec.partition_ids)
        # A worker driving part of the world waits for JoinWorld, as the real one does.
        self.world_round = 1 if self.dp == len(spec.partition_ids) else 0
        self.joined_rounds: list[int] = []

    async def Describe(self, request, context):
        s = self.spec
        return worker_pb2.DescribeResponse(
            abi_version=s.abi_version, build_id="fake-build", model_fingerprint=s.fingerprint,
            topology=worker_pb2.Topology(world_size=self.dp, dp=self.dp, tp=1, ep=1,
                                         host_ranks=list(s.partition_ids), backend="cpu"),
            world_round=self.world_round,
            block_size=s.block_size, vocab_size=VOCAB_SIZE, eos_token_id=EOS_TOKEN_ID,
            partition_ids=list(s.partition_ids),
            block_groups=[worker_pb2.BlockGroup(name="window", num_blocks=s.num_window_blocks,
                                                sliding_window=s.sliding_window),
                          worker_pb2.BlockGroup(name="compressed", num_blocks=s.num_blocks)],
            max_num_batched_tokens=s.max_num_batched_tokens, compute_dtype="float32")

    async def JoinWorld(self, request, context):
        self.world_round = request.round
        self.joined_rounds.append(request.round)
        return worker_pb2.JoinWorldResponse(round=request.round)

    async def Step(self, request_iterator, context):
        self.live.clear()  # every new stream starts with no sequences
        self.ended.clear()
        async for request in request_iterator:
            if self.hang.is_set():
                await asyncio.Event().wait()
            self.step_requests.append(request)
            yield self._run(request)

    def _run(self, request: worker_pb2.StepRequest) -> worker_pb2.StepResponse:
        for seq_id in request.finished_seq_ids:
            # Finished ids go to every worker: an id never seen here is another worker's.
            if seq_id in self.ended:
                self._violate(f"step {request.step_id}: seq {seq_id} finished twice")
            if self.live.pop(seq_id, None) is not None:
                self.ended.add(seq_id)
        for new in request.new_sequences:
            if new.seq_id in self.live or new.partition_id not in self.spec.partition_ids:
                self._violate(f"step {request.step_id}: bad NewSequence {new.seq_id}")
            self.live[new.seq_id] = _Sequence(new.partition_id, list(new.prompt_token_ids))
        results = []
        for row in request.rows:
            error = self._check_and_advance(row)
            if error:
                self._violate(f"step {request.step_id}: seq {row.seq_id}: {error}")
                results.append(worker_pb2.RowResult(seq_id=row.seq_id, error=error))
            elif row.sample:
                token = self._sample(self.live[row.seq_id].tokens, row.mask)
                results.append(worker_pb2.RowResult(seq_id=row.seq_id, sampled_token_id=token))
        return worker_pb2.StepResponse(step_id=request.step_id, results=results, forward_ns=1)

    def _check_and_advance(self, row: worker_pb2.ScheduledRow) -> str:
        seq = self.live.get(row.seq_id)
        if seq is None:
            return "row for a sequence this stream does not know"
        if row.num_computed_tokens != seq.num_cached:
            return f"row starts at {row.num_computed_tokens} but {seq.num_cached} are cached"
        seq.tokens.extend(row.append_token_ids)
        end = row.num_computed_tokens + row.num_new_tokens
        if row.num_new_tokens < 1 or end > len(seq.tokens):
            return f"row covers [.., {end}) but {len(seq.tokens)} tokens are known"
        if row.sample != (end == len(seq.tokens)):
            return f"sample={row.sample} at {end} of {len(seq.tokens)} tokens"
        ownership = self._check_new_blocks(row, seq)
        if ownership:
            return ownership
        seq.blocks.extend(row.new_block_ids)
        seq.window_blocks.extend(row.new_window_block_ids)
        bs = self.spec.block_size
        if len(seq.blocks) * bs < end or len(seq.window_blocks) * bs < end:
            return f"block tables ({len(seq.blocks)}, {len(seq.window_blocks)}) do not cover {end}"
        seq.num_cached = end
        return ""

    def _check_new_blocks(self, row: worker_pb2.ScheduledRow, seq: _Sequence) -> str:
        for other_id, other in self.live.items():
            if other is seq or other.partition_id != seq.partition_id:
                continue
            shared = set(row.new_block_ids) & set(other.blocks)
            if shared:
                return f"compressed blocks {sorted(shared)} belong to live seq {other_id}"
            in_window = set(other.window_blocks[self._first_live_window_block(other):])
            shared = set(row.new_window_block_ids) & in_window
            if shared:
                return f"window blocks {sorted(shared)} are in seq {other_id}'s window"
        return ""

    def _first_live_window_block(self, seq: _Sequence) -> int:
        return max(0, (seq.num_cached - self.spec.sliding_window + 1) // self.spec.block_size)

    def _sample(self, tokens: list[int], mask: worker_pb2.TokenMask) -> int:
        if self.spec.eos_after_token is not None and tokens[-1] == self.spec.eos_after_token:
            token = EOS_TOKEN_ID
        else:
            token = next_token(tokens)
        allowed = _allowed(mask)
        if allowed is not None and token not in allowed:
            token = min(allowed)
        return token

    def _violate(self, message: str) -> None:
        self.violations.append(message)


def _allowed(mask: worker_pb2.TokenMask) -> Optional[set[int]]:
    if mask.allowed_token_ids:
        return set(mask.allowed_token_ids)
    if mask.bitmask:
        words = memoryview(mask.bitmask).cast("i")
        return {32 * w + b for w, word in enumerate(words) for b in range(32) if word >> b & 1}
    return None


@dataclass
class RunningFakeWorker:
    server: grpc.aio.Server
    port: int
    worker: FakeWorker
    health: health_aio.HealthServicer

    async def set_serving(self, serving: bool) -> None:
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING if serving
                              else health_pb2.HealthCheckResponse.NOT_SERVING)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.stop(0)


async def start_fake_worker(spec: FakeWorkerSpec, port: int = 0) -> RunningFakeWorker:
    server = grpc.aio.server()
    worker = FakeWorker(spec)
    worker_pb2_grpc.add_WorkerServicer_to_server(worker, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    running = RunningFakeWorker(server, bound, worker, health)
    await running.set_serving(spec.serving)
    await server.start()
    return running
