"""What this host's ranks are before any starts: one `RankSpec` per driven rank, where the world's
TCPStore lives, and the factory each rank process builds its runtime with."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from services.common.config import WorkerConfig
from services.worker.capacity import ModelFacts, describe_model
from services.worker.executor import StepRuntime
from services.worker.sequence_state import PartitionLimits
from services.worker.model.collectives import Collectives
from services.worker.model.parallel import ParallelLayout
from services.worker.rank_messages import RankSpec


class RuntimeFactory(Protocol):
    """Where the model comes from. Must be picklable: `build` runs in the spawned rank processes."""

    def describe(self, config: WorkerConfig) -> ModelFacts:
        """Host side, before any rank starts: model facts and cache capacity, no weights loaded."""
        ...

    def build(self, spec: RankSpec, collectives: Collectives) -> StepRuntime: ...


@dataclass(frozen=True)
class ModelRuntimeFactory:
    """The real DeepSeek-V4 runtime."""

    def describe(self, config: WorkerConfig) -> ModelFacts:
        return describe_model(config)

    def build(self, spec: RankSpec, collectives: Collectives) -> StepRuntime:
        from services.worker.model.runtime import ModelRuntime, RuntimeConfig

        from services.worker.speculation import make_drafter

        runtime = ModelRuntime(RuntimeConfig(
            model_dir=spec.model_dir, dtype=getattr(torch, spec.dtype), device=spec.device,
            block_size=spec.limits.block_size, num_blocks=spec.limits.num_blocks),
            spec.layout, collectives)
        runtime.drafter = make_drafter(spec.speculative, runtime)
        return runtime


@dataclass(frozen=True)
class StoreAddress:
    """The world's TCPStore: served by this host when `serve` (it drives global rank 0)."""

    host: str
    port: int  # 0 with serve: a free port
    serve: bool


def rank_specs(config: WorkerConfig, facts: ModelFacts) -> list[RankSpec]:
    """One spec per rank this host drives (store port filled in at start)."""
    topology = config.topology
    on_cuda = topology.backend == "cuda"
    specs = []
    for rank in config.driven_ranks:
        layout = ParallelLayout(rank=rank, dp=topology.dp, tp=topology.tp, ep=topology.ep)
        limits = PartitionLimits(partition_id=layout.partition_id, vocab_size=facts.vocab_size,
                                 block_size=config.block_size,
                                 num_blocks=facts.num_blocks_per_group,
                                 block_groups=tuple(g.name for g in facts.block_groups))
        device_index = topology.devices[rank] if topology.devices else rank
        specs.append(RankSpec(layout=layout, dist_backend="nccl" if on_cuda else "gloo",
                              device=f"cuda:{device_index}" if on_cuda else "cpu",
                              store_host=store_address(config).host, store_port=0,
                              model_dir=config.model_dir, dtype=facts.compute_dtype,
                              limits=limits, torch_threads=config.torch_threads,
                              speculative=config.speculative))
    return specs


def store_address(config: WorkerConfig) -> StoreAddress:
    """A worker driving the whole world serves its store on a free loopback port; otherwise the
    store is at --dist-init-addr, served by the worker that drives global rank 0."""
    if config.dist_init_addr is None:
        return StoreAddress("127.0.0.1", 0, serve=True)
    host, _, port = config.dist_init_addr.rpartition(":")
    return StoreAddress(host, int(port), serve=0 in config.driven_ranks)
