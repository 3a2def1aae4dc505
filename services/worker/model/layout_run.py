"""Run a fixed greedy workload on a parallel layout with real rank processes, without any service.

Each of the world's dp × tp ranks is a spawned process in one gloo (or NCCL) world that loads its
share of the checkpoint, exactly as a worker's ranks do. The prompts are dealt to the partitions
round robin; every partition prefills its prompts in chunks side by side, then decodes them; every
rank runs every step, with no rows once its partition is done (as an idle DP group does). The
partition leaders report each prompt's greedy tokens and the logits at every sampled position.

Used by the tests that hold a layout to the single-rank run, and by the benchmarks.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from services.worker.model.collectives import TorchCollectives
from services.worker.model.kv_cache import PagedKvCache
from services.worker.model.parallel import ParallelLayout
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk

_TIMEOUT = timedelta(seconds=600)


@dataclass(frozen=True)
class Workload:
    prompts: tuple[tuple[int, ...], ...]
    num_new_tokens: int
    chunk_size: int = 128
    block_size: int = 32
    # Fill every cache with NaN first: outputs then prove that nothing unwritten is read, and
    # `LayoutRun.untouched_partitions` which partitions' caches nothing was written to.
    poison_caches: bool = False


@dataclass
class PromptOutput:
    tokens: list[int]
    logits: list[torch.Tensor]  # fp32 [V] at every sampled position


@dataclass
class LayoutRun:
    outputs: dict[int, PromptOutput]  # by prompt index
    decode_s: float                   # wall time of the decode steps (slowest partition leader)
    collective_s: float               # of that, inside collectives (max over the leaders)
    decode_tokens: int                # tokens decoded over all partitions
    untouched_partitions: frozenset[int] = frozenset()  # caches still all NaN (poison_caches)


def run_layout(model_dir: Path, dp: int, tp: int, ep: int, workload: Workload,
               dtype: torch.dtype = torch.float32, threads: int = 1) -> LayoutRun:
    """Runs `workload` on dp × tp rank processes and collects the partition leaders' outputs."""
    world = dp * tp
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                          timeout=_TIMEOUT)
    context = torch_mp.get_context("spawn")
    pipes = [context.Pipe(duplex=False) for _ in range(world)]
    processes = [context.Process(target=_rank_main, daemon=True, name=f"layout-rank{rank}",
                                 args=(ParallelLayout(rank, dp, tp, ep), store.port, model_dir,
                                       workload, dtype, threads, pipes[rank][1]))
                 for rank in range(world)]
    for process in processes:
        process.start()
    try:
        reports = [_receive(pipes[rank][0], processes)
                   for rank in range(world) if ParallelLayout(rank, dp, tp, ep).leads_partition]
    finally:
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()
    errors = [r for r in reports if isinstance(r, str)]
    if errors:
        raise RuntimeError("; ".join(errors))
    outputs = {index: PromptOutput(tokens, [torch.from_numpy(row) for row in logits])
               for report in reports for index, (tokens, logits) in report["outputs"].items()}
    return LayoutRun(outputs, max(r["decode_s"] for r in reports),
                     max(r["collective_s"] for r in reports),
                     len(workload.prompts) * (workload.num_new_tokens - 1),
                     frozenset(r["partition"] for r in reports if r["untouched"]))


def _receive(conn: Connection, processes: list) -> Any:
    """A leader's report, or an error naming a rank process that died without one."""
    while not wait([conn], timeout=1.0):
        dead = [p for p in processes if p.exitcode not in (None, 0)]
        if dead:
            return f"rank process {dead[0].name} exited with code {dead[0].exitcode}"
    return conn.recv()


def _rank_main(layout: ParallelLayout, store_port: int, model_dir: Path, workload: Workload,
               dtype: torch.dtype, threads: int, conn: Connection) -> None:
    torch.set_num_threads(threads)
    try:
        report = _serve_partition(layout, store_port, model_dir, workload, dtype)
    except Exception as error:  # reported by the leader; the others' failures surface through it
        report = f"rank {layout.rank}: {type(error).__name__}: {error}"
    if layout.leads_partition:
        conn.send(report)


def _serve_partition(layout: ParallelLayout, store_port: int, model_dir: Path,
                     workload: Workload, dtype: torch.dtype) -> dict:
    store = dist.TCPStore("127.0.0.1", store_port, layout.world_size, is_master=False,
                          timeout=_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=layout.rank, world_size=layout.world_size,
                            timeout=_TIMEOUT)
    collectives = TorchCollectives.create(layout)
    mine = list(range(layout.partition_id, len(workload.prompts), layout.dp))
    longest = max(len(p) for p in workload.prompts) + workload.num_new_tokens
    blocks_per_seq = math.ceil(longest / workload.block_size)
    runtime = ModelRuntime(RuntimeConfig(
        model_dir=model_dir, dtype=dtype, device="cpu", block_size=workload.block_size,
        num_blocks=max(1, len(mine)) * blocks_per_seq), layout, collectives)
    if workload.poison_caches:
        for tensor in _all_storage(runtime.cache):
            tensor.fill_(float("nan"))
    schedule = _Schedule(workload, mine, blocks_per_seq, runtime.cache)
    decode_started, collective_before = 0.0, 0
    for step in range(_steps_needed(workload)):
        if step == _prefill_steps(workload):
            decode_started, collective_before = time.perf_counter(), collectives.elapsed_ns
        # Every TP rank samples (their logits are the same) so each knows the next decode token.
        chunks = schedule.chunks()
        out = runtime.step(chunks, return_logits=layout.leads_partition)
        schedule.record(chunks, out.sampled, out.logits)
    dist.barrier()
    dist.destroy_process_group()
    # numpy, not tensors: torch would pass tensors through shared memory that dies with this process.
    outputs = {i: (out.tokens, [row.numpy() for row in out.logits])
               for i, out in schedule.outputs.items()}
    untouched = workload.poison_caches and all(bool(t.isnan().all())
                                               for t in _all_storage(runtime.cache))
    return {"outputs": outputs, "partition": layout.partition_id, "untouched": untouched,
            "decode_s": time.perf_counter() - decode_started,
            "collective_s": (collectives.elapsed_ns - collective_before) / 1e9}


def _all_storage(cache: PagedKvCache) -> list[torch.Tensor]:
    return [tensor for group in cache.group_windows for tensor in cache.storage(group)]


def _prefill_steps(workload: Workload) -> int:
    return math.ceil(max(len(p) for p in workload.prompts) / workload.chunk_size)


def _steps_needed(workload: Workload) -> int:
    return _prefill_steps(workload) + workload.num_new_tokens - 1


class _Schedule:
    """One partition's sequences: chunked prefill side by side, then one decode token each."""

    def __init__(self, workload: Workload, prompt_ids: list[int], blocks_per_seq: int,
                 cache: PagedKvCache) -> None:
        self.workload = workload
        self.tokens = {i: list(workload.prompts[i]) for i in prompt_ids}
        self.computed = {i: 0 for i in prompt_ids}
        self.blocks = {i: cache.same_table_for_every_group(
                           list(range(k * blocks_per_seq, (k + 1) * blocks_per_seq)))
                       for k, i in enumerate(prompt_ids)}
        self.outputs = {i: PromptOutput([], []) for i in prompt_ids}

    def chunks(self) -> list[SequenceChunk]:
        chunks = []
        for i, tokens in self.tokens.items():
            start = self.computed[i]
            if len(self.outputs[i].tokens) == self.workload.num_new_tokens or start == len(tokens):
                continue
            end = min(len(tokens), start + self.workload.chunk_size)
            chunks.append(SequenceChunk(seq_id=i, start_pos=start, token_ids=tokens[start:end],
                                        block_tables=self.blocks[i],
                                        sample=end == len(tokens)))
        return chunks

    def record(self, chunks: list[SequenceChunk], sampled: list, logits: list) -> None:
        for chunk, token, row_logits in zip(chunks, sampled, logits):
            self.computed[chunk.seq_id] = chunk.start_pos + len(chunk.token_ids)
            if token is not None:
                self.tokens[chunk.seq_id].append(token)
                self.outputs[chunk.seq_id].tokens.append(token)
                self.outputs[chunk.seq_id].logits.append(row_logits)
