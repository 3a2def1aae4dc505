"""An in-process fake Worker: checks every step descriptor it receives and "samples" a
deterministic function of each sequence's tokens, so scheduler tests can compare outputs exactly.

Checks (each failure is recorded in `violations` and answered as a row error): a NewSequence is new
and in a partition this worker holds; rows start where the sequence's cache ends (positions
contiguous; a prefix-cache hit starts at its cached length); a row's tokens are all known; every
group's table covers the row; no block a row writes is still live in another sequence's table (a
shared prefix block is read-only); every block a row reads holds exactly this sequence's tokens —
the fake cache remembers, per physical block, a hash of the token prefix written into it, so a
prefix hit on the wrong content, or a block overwritten while shared, shows; rows sample exactly
when they reach the sequence's last token; masks are obeyed. Async scheduling as the real worker
does it: a row may feed the token its sequence sampled last (never twice), and a row whose mask
follows is sampled only once that step's masks message came (before any later step).
"""
from __future__ import annotations

import asyncio
import itertools
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
    # Running sequences per partition it sized per-sequence state for (0: no bound).
    max_num_seqs: int = 0
    # A second windowed group, like the real worker's compressor rows (0: none).
    state_window: int = 12
    abi_version: int = ABI_VERSION
    fingerprint: str = FINGERPRINT
    serving: bool = True  # its grpc.health.v1 status
    # When set, the fake model answers EOS right after this token.
    eos_after_token: Optional[int] = None
    # Simulated compute: each step is answered this much later, and reports it as its forward.
    step_s: float = 0.0
    # The first this many JoinWorld calls fail (UNAVAILABLE), as a join that timed out.
    join_failures: int = 0


@dataclass
class _Sequence:
    partition_id: int
    tokens: list[int]
    num_cached: int = 0
    tables: dict[str, list[int]] = field(default_factory=dict)
    prefix_hashes: list[int] = field(default_factory=lambda: [0])

    def prefix_hash(self, length: int) -> int:
        """A hash naming tokens[:length]."""
        while len(self.prefix_hashes) <= length:
            n = len(self.prefix_hashes)
            self.prefix_hashes.append(hash((self.prefix_hashes[-1], self.tokens[n - 1])))
        return self.prefix_hashes[length]


_instance_ids = itertools.count(1)


class FakeWorker(worker_pb2_grpc.WorkerServicer):
    def __init__(self, spec: FakeWorkerSpec) -> None:
        self.spec = spec
        self.instance_id = next(_instance_ids)  # a restarted worker is a new FakeWorker
        self.violations: list[str] = []
        self.step_requests: list[worker_pb2.StepRequest] = []
        self.hang = asyncio.Event()  # set: stop answering steps (a hung worker)
        self.live: dict[int, _Sequence] = {}
        self.ended: set[int] = set()  # sequences of this worker already finished
        self.last_sampled: dict[int, int] = {}  # seq → the token its last row sampled, until fed
        self.dp = spec.dp or len(spec.partition_ids)
        # A worker driving part of the world waits for JoinWorld, as the real one does.
        self.world_round = 1 if self.dp == len(spec.partition_ids) else 0
        self.joined_rounds: list[int] = []
        self.join_attempts: list[int] = []  # every JoinWorld's round, failed ones included
        # (partition, group, block) → prefix hash of the tokens whose rows the block holds
        self.contents: dict[tuple[int, str, int], int] = {}

    @property
    def windows(self) -> dict[str, int]:
        """Block groups and their sliding windows."""
        groups = {"window": self.spec.sliding_window, "compressed": 0}
        if self.spec.state_window:
            groups["state"] = self.spec.state_window
        return groups

    async def Describe(self, request, context):
        s = self.spec
        return worker_pb2.DescribeResponse(
            abi_version=s.abi_version, build_id="fake-build", model_fingerprint=s.fingerprint,
            topology=worker_pb2.Topology(world_size=self.dp, dp=self.dp, tp=1, ep=1,
                                         host_ranks=list(s.partition_ids), backend="cpu"),
            world_round=self.world_round,
            block_size=s.block_size, vocab_size=VOCAB_SIZE, eos_token_id=EOS_TOKEN_ID,
            partition_ids=list(s.partition_ids),
            block_groups=[worker_pb2.BlockGroup(
                name=name, sliding_window=window,
                num_blocks=s.num_blocks if name == "compressed" else s.num_window_blocks)
                for name, window in self.windows.items()],
            max_num_batched_tokens=s.max_num_batched_tokens, compute_dtype="float32",
            max_num_seqs=s.max_num_seqs, instance_id=self.instance_id)

    async def JoinWorld(self, request, context):
        self.join_attempts.append(request.round)
        if len(self.join_attempts) <= self.spec.join_failures:
            self.world_round = 0
            await context.abort(grpc.StatusCode.UNAVAILABLE, "joining timed out")
        self.world_round = request.round
        self.joined_rounds.append(request.round)
        return worker_pb2.JoinWorldResponse(round=request.round)

    async def Step(self, request_iterator, context):
        self.live.clear()  # every new stream starts with no sequences
        self.ended.clear()
        self.last_sampled.clear()
        awaiting_masks: Optional[worker_pb2.StepRequest] = None
        async for request in request_iterator:
            if self.hang.is_set():
                await asyncio.Event().wait()
            if request.HasField("masks"):
                if awaiting_masks is None or awaiting_masks.step_id != request.masks.step_id:
                    self._violate(f"masks of step {request.masks.step_id} nobody awaits")
                    continue
                await self._compute()
                yield self.run_step(awaiting_masks, {m.seq_id: m for m in request.masks.rows})
                awaiting_masks = None
                continue
            if awaiting_masks is not None:
                self._violate(f"step {request.step_id} came before the masks of step "
                              f"{awaiting_masks.step_id}")
            self.step_requests.append(request)
            if any(row.mask_follows for row in request.rows):
                awaiting_masks = request  # the forward would run now; sampling awaits the masks
                continue
            await self._compute()
            yield self.run_step(request)

    async def _compute(self) -> None:
        if self.spec.step_s:
            await asyncio.sleep(self.spec.step_s)

    def run_step(self, request: worker_pb2.StepRequest,
                 masks: Optional[dict[int, worker_pb2.RowMask]] = None) -> worker_pb2.StepResponse:
        for seq_id in request.finished_seq_ids:
            # Finished ids go to every worker: an id never seen here is another worker's.
            if seq_id in self.ended:
                self._violate(f"step {request.step_id}: seq {seq_id} finished twice")
            if self.live.pop(seq_id, None) is not None:
                self.ended.add(seq_id)
        for new in request.new_sequences:
            if new.seq_id in self.live or new.partition_id not in self.spec.partition_ids:
                self._violate(f"step {request.step_id}: bad NewSequence {new.seq_id}")
            self.live[new.seq_id] = _Sequence(new.partition_id, list(new.prompt_token_ids),
                                              new.num_cached_tokens,
                                              {name: [] for name in self.windows})
        results = []
        for row in request.rows:
            error = self._check_and_advance(row)
            if error:
                self._violate(f"step {request.step_id}: seq {row.seq_id}: {error}")
                results.append(worker_pb2.RowResult(seq_id=row.seq_id, error=error))
            elif row.sample:
                token = self._sample(self.live[row.seq_id].tokens, self._mask(row, masks or {}))
                self.last_sampled[row.seq_id] = token
                results.append(worker_pb2.RowResult(seq_id=row.seq_id, sampled_token_id=token))
        return worker_pb2.StepResponse(step_id=request.step_id, results=results,
                                       forward_ns=max(1, int(self.spec.step_s * 1e9)))

    def _mask(self, row: worker_pb2.ScheduledRow,
              masks: dict[int, worker_pb2.RowMask]) -> worker_pb2.TokenMask:
        if not row.mask_follows:
            return row.mask
        follow = masks.get(row.seq_id)
        if follow is None:
            self._violate(f"no mask followed for seq {row.seq_id}")
            return worker_pb2.TokenMask()
        return worker_pb2.TokenMask() if follow.discard else follow.mask

    def _check_and_advance(self, row: worker_pb2.ScheduledRow) -> str:
        seq = self.live.get(row.seq_id)
        if seq is None:
            return "row for a sequence this stream does not know"
        if row.num_computed_tokens != seq.num_cached:
            return f"row starts at {row.num_computed_tokens} but {seq.num_cached} are cached"
        if row.append_last_sampled:
            if row.seq_id not in self.last_sampled:
                return "fed its last sampled token, but its previous row sampled none"
            seq.tokens.append(self.last_sampled.pop(row.seq_id))
        seq.tokens.extend(row.append_token_ids)
        end = row.num_computed_tokens + row.num_new_tokens
        if row.num_new_tokens < 1 or end > len(seq.tokens):
            return f"row covers [.., {end}) but {len(seq.tokens)} tokens are known"
        if row.sample != (end == len(seq.tokens)):
            return f"sample={row.sample} at {end} of {len(seq.tokens)} tokens"
        for blocks in row.new_blocks:
            table = seq.tables[blocks.group]
            if blocks.first_logical_block < len(table):
                return f"{blocks.group} blocks overwrite logical block {blocks.first_logical_block}"
            table.extend([-1] * (blocks.first_logical_block - len(table)) + list(blocks.block_ids))
        bs = self.spec.block_size
        if any(len(table) * bs < end for table in seq.tables.values()):
            return f"block tables {[len(t) for t in seq.tables.values()]} do not cover {end}"
        problem = self._check_reads(seq, row.num_computed_tokens) or self._check_writes(
            row.seq_id, seq, row.num_computed_tokens, end)
        if problem:
            return problem
        self._write(seq, row.num_computed_tokens, end)
        seq.num_cached = end
        return ""

    def _first_read_block(self, group: str, position: int) -> int:
        window = self.windows[group]
        return 0 if window == 0 else max(0, position - window + 1) // self.spec.block_size

    def _check_reads(self, seq: _Sequence, start: int) -> str:
        """Every block a row from `start` reads holds this sequence's tokens."""
        bs = self.spec.block_size
        for group, table in seq.tables.items():
            for logical in range(self._first_read_block(group, start), -(-start // bs)):
                block = table[logical]
                held = self.contents.get((seq.partition_id, group, block))
                if block < 0 or held != seq.prefix_hash(min((logical + 1) * bs, start)):
                    return f"{group} block {block} (logical {logical}) holds other tokens"
        return ""

    def _check_writes(self, seq_id: int, seq: _Sequence, start: int, end: int) -> str:
        """No block the row writes is live in another sequence's table."""
        bs = self.spec.block_size
        for group, table in seq.tables.items():
            written = {table[i] for i in range(start // bs, -(-end // bs))}
            for other_id, other in self.live.items():
                if other is seq or other.partition_id != seq.partition_id:
                    continue
                live = other.tables[group][self._first_read_block(group, other.num_cached):]
                shared = written & set(live)
                if shared:
                    return f"{group} blocks {sorted(shared)} are live in seq {other_id}"
        return ""

    def _write(self, seq: _Sequence, start: int, end: int) -> None:
        bs = self.spec.block_size
        for group, table in seq.tables.items():
            for logical in range(start // bs, -(-end // bs)):
                key = (seq.partition_id, group, table[logical])
                self.contents[key] = seq.prefix_hash(min((logical + 1) * bs, end))

    def _sample(self, tokens: list[int], mask: worker_pb2.TokenMask) -> int:
        if self.spec.eos_after_token is not None and tokens[-1] == self.spec.eos_after_token:
            token = EOS_TOKEN_ID
        else:
            token = next_token(tokens)
        if mask.refused_token_ids:
            refused = set(mask.refused_token_ids)
            return token if token not in refused else min(set(range(len(refused) + 1)) - refused)
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
