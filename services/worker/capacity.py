"""What the worker tells the scheduler about its model and cache: the facts behind `Describe`.

Computed on the host before any rank starts, from `config.json`, the checkpoint's tensor index and
`ModelRuntime.block_bytes` — no weights are loaded. Block capacity is `--num-blocks` when given, else
the KV memory budget divided by the bytes one block costs in both groups together (both groups get
the same count, as `WorkerConfig.num_blocks` is per group).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from services.common.config import WorkerConfig

WINDOW_GROUP = "window"
COMPRESSED_GROUP = "compressed"


@dataclass(frozen=True)
class BlockGroupInfo:
    name: str
    num_blocks: int  # per partition
    bytes_per_block: int
    sliding_window: int  # tokens kept; 0 = the whole sequence


@dataclass(frozen=True)
class CacheFamilyInfo:
    name: str
    group: str  # empty for per-sequence state families
    rows_per_block: int  # summed over layers
    bytes_per_block: int
    bytes_per_sequence: int  # per-sequence state families only


@dataclass(frozen=True)
class ModelFacts:
    vocab_size: int
    eos_token_id: int
    model_fingerprint: str
    compute_dtype: str  # "float32" or "bfloat16"
    block_groups: tuple[BlockGroupInfo, ...]
    cache_families: tuple[CacheFamilyInfo, ...]

    def num_blocks(self, group: str) -> int:
        for info in self.block_groups:
            if info.name == group:
                return info.num_blocks
        raise KeyError(f"no block group named {group!r}")


def compute_dtype_name(config: WorkerConfig) -> str:
    """`--dtype`, else float32 on CPU and bfloat16 on CUDA."""
    if config.dtype is not None:
        return config.dtype
    return "bfloat16" if config.topology.backend == "cuda" else "float32"


def blocks_per_group(config: WorkerConfig, bytes_per_block_all_groups: int) -> int:
    """`--num-blocks`, else how many blocks of every group fit the KV memory budget together."""
    if config.num_blocks is not None:
        return config.num_blocks
    blocks = config.kv_cache_memory_bytes // max(bytes_per_block_all_groups, 1)
    if blocks < 1:
        raise ValueError(f"--kv-cache-memory {config.kv_cache_memory_bytes} bytes holds no block: one "
                         f"block costs {bytes_per_block_all_groups} bytes across the block groups")
    return blocks


def model_fingerprint(config_fingerprint: str, checkpoint_fingerprint: str) -> str:
    """sha256 over the canonical config and the checkpoint's tensor index."""
    return hashlib.sha256(f"{config_fingerprint}\n{checkpoint_fingerprint}".encode()).hexdigest()
