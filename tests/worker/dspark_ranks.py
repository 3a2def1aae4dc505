"""Rank processes of a sharded layout that prefill one prompt in partition 0 and draft after it;
every other partition runs the same steps with no rows (as an idle DP group does)."""
from __future__ import annotations

from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from services.worker.model.collectives import TorchCollectives
from services.worker.model.drafter import Draft, DraftRequest
from services.worker.model.dspark import DSparkDrafter
from services.worker.model.parallel import ParallelLayout
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk

_TIMEOUT = timedelta(seconds=300)


def draft_on_layout(model_dir: Path, dp: int, tp: int, ep: int, prompt: list[int],
                    num_drafts: int) -> Draft:
    """Partition 0's draft after `prompt`, computed by dp × tp rank processes."""
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False,
                          timeout=_TIMEOUT)
    context = torch_mp.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    processes = [context.Process(target=_rank_main, daemon=True,
                                 args=(ParallelLayout(rank, dp, tp, ep), store.port, model_dir,
                                       prompt, num_drafts, send))
                 for rank in range(dp * tp)]
    for process in processes:
        process.start()
    try:
        while not wait([receive], timeout=1.0):
            dead = [p for p in processes if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a rank process exited with code {dead[0].exitcode}")
        report: Any = receive.recv()
    finally:
        for process in processes:
            process.join(60)
            if process.is_alive():
                process.kill()
    if isinstance(report, str):
        raise RuntimeError(report)
    return report


def _rank_main(layout: ParallelLayout, port: int, model_dir: Path, prompt: list[int],
               num_drafts: int, conn: Connection) -> None:
    torch.set_num_threads(1)
    try:
        draft = _draft(layout, port, model_dir, prompt, num_drafts)
    except Exception as error:
        draft = f"rank {layout.rank}: {type(error).__name__}: {error}"
    if layout.rank == 0 or isinstance(draft, str):
        conn.send(draft)


def _draft(layout: ParallelLayout, port: int, model_dir: Path, prompt: list[int],
           num_drafts: int) -> Draft | None:
    store = dist.TCPStore("127.0.0.1", port, layout.world_size, is_master=False,
                          timeout=_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=layout.rank, world_size=layout.world_size,
                            timeout=_TIMEOUT)
    runtime = ModelRuntime(RuntimeConfig(model_dir, torch.float32, "cpu", 16, 4), layout,
                           TorchCollectives.create(layout))
    drafter = DSparkDrafter(runtime.model)
    busy = layout.partition_id == 0
    tables = runtime.cache.same_table_for_every_group(list(range(4)))
    chunks = [SequenceChunk(1, 0, prompt, tables, sample=True)] if busy else []
    out = runtime.step(chunks, return_taps=drafter.tap_layer_ids)
    if busy:
        drafter.observe(1, 0, out.taps[0])
    requests = [DraftRequest(1, out.sampled[0], len(prompt), num_drafts)] if busy else []
    drafts = drafter.propose(requests)
    dist.barrier()
    dist.destroy_process_group()
    return drafts[0] if busy else None
