"""What the scheduler keeps of a worker's Describe answer (the handshake)."""
from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.kv_cache import BlockGroupSpec


@dataclass(frozen=True)
class WorldTopology:
    """The torch.distributed world every worker of a deployment must agree on."""

    world_size: int
    dp: int
    tp: int
    ep: int
    backend: str


@dataclass(frozen=True)
class WorkerDescription:
    abi_version: int
    build_id: str
    model_fingerprint: str
    block_size: int
    vocab_size: int
    eos_token_id: int
    partition_ids: tuple[int, ...]
    block_groups: tuple[BlockGroupSpec, ...]
    max_num_batched_tokens: int
    topology: WorldTopology = WorldTopology(1, 1, 1, 1, "cpu")
    # Global ranks this worker drives.
    host_ranks: tuple[int, ...] = (0,)
    # The round of the world its ranks joined (0: loaded, not joined; see worker.proto).
    world_round: int = 1
    compute_dtype: str = "float32"  # "float32" or "bfloat16": part of what a cached block holds
    # Running sequences per partition the worker sized its per-sequence drafter state for; 0: none.
    max_num_seqs: int = 0
    # Random per worker process: another value at a probe means the worker restarted.
    instance_id: int = 0
