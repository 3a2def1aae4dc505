"""What the worker tells the scheduler about its model and cache: the facts behind `Describe`.

Computed on the host before any rank starts, from `config.json`, the checkpoint's tensor index and
`ModelRuntime.block_bytes` — no weights are loaded. Block capacity is `--num-blocks` when given,
else the KV memory budget divided by the bytes one block costs in every group together (plus the
MTP drafter's cache, which is paged with the same blocks), after a DSpark drafter's per-sequence
windows for `--max-num-seqs` sequences (the scheduler runs no more than that many per partition).
Every group gets the same count (`WorkerConfig.num_blocks` is per group): a prefix-cache hit at a
block boundary needs, in each windowed group, the blocks just before it, so keeping every boundary
of a cached prefix hittable takes as many blocks in each group as in the whole-sequence group.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from services.common.cli_values import DSPARK_METHOD, MTP_METHOD
from services.common.config import WorkerConfig
from services.worker.speculation import check_speculation
from services.worker.model.checkpoint_fingerprint import checkpoint_fingerprint
from services.worker.model.config import ModelConfig
from services.worker.model.dspark import window_bytes
from services.worker.model.kv_cache import FAMILY_GROUPS, rows_per_block
from services.worker.model.parallel import check_topology
from services.worker.model.runtime import BlockCost, ModelRuntime


@dataclass(frozen=True)
class BlockGroupInfo:
    name: str
    num_blocks: int  # per partition
    bytes_per_block: int
    sliding_window: int  # tokens kept; 0 = the whole sequence


@dataclass(frozen=True)
class CacheFamilyInfo:
    name: str
    group: str
    rows_per_block: int  # summed over layers
    bytes_per_block: int


@dataclass(frozen=True)
class ModelFacts:
    vocab_size: int
    eos_token_id: int
    model_fingerprint: str
    compute_dtype: str  # "float32" or "bfloat16"
    block_groups: tuple[BlockGroupInfo, ...]
    cache_families: tuple[CacheFamilyInfo, ...]
    # Running sequences per partition the drafter's per-sequence state was sized for (DSpark);
    # 0: the worker keeps nothing per sequence, so it sets no bound.
    max_num_seqs: int = 0

    @property
    def num_blocks_per_group(self) -> int:
        """Blocks of each group (every group has the same count)."""
        return self.block_groups[0].num_blocks


def compute_dtype_name(config: WorkerConfig) -> str:
    """`--dtype`, else float32 on CPU and bfloat16 on CUDA."""
    if config.dtype is not None:
        return config.dtype
    return "bfloat16" if config.topology.backend == "cuda" else "float32"


def blocks_per_group(config: WorkerConfig, bytes_per_block_all_groups: int,
                     sequence_state_bytes: int = 0) -> int:
    """`--num-blocks`, else how many blocks of every group fit together in the KV memory budget
    left after `sequence_state_bytes` (the drafter's per-sequence state)."""
    if config.num_blocks is not None:
        return config.num_blocks
    blocks = max(config.kv_cache_memory_bytes - sequence_state_bytes, 0) // max(
        bytes_per_block_all_groups, 1)
    if blocks < 1:
        windows = (f" after {sequence_state_bytes} bytes of DSpark windows (--max-num-seqs "
                   f"{config.max_num_seqs})" if sequence_state_bytes else "")
        raise ValueError(f"--kv-cache-memory {config.kv_cache_memory_bytes} bytes holds no block"
                         f"{windows}: one block costs {bytes_per_block_all_groups} bytes across "
                         f"the block groups")
    return blocks


def model_fingerprint(config_fingerprint: str, checkpoint_fingerprint: str) -> str:
    """sha256 over the canonical config and the checkpoint's tensor index."""
    return hashlib.sha256(f"{config_fingerprint}\n{checkpoint_fingerprint}".encode()).hexdigest()


def describe_model(config: WorkerConfig) -> ModelFacts:
    """Reads config.json and fingerprints the checkpoint (no weights loaded). Raises TopologyError
    when --tp/--ep do not divide the model, SpeculationError when --speculative-config cannot be
    served."""
    model = ModelConfig.from_json_file(Path(config.model_dir) / "config.json")
    topology = config.topology
    check_topology(model, topology.dp, topology.tp, topology.ep)
    check_speculation(config.speculative, model)
    dtype_name = compute_dtype_name(config)
    dtype = getattr(torch, dtype_name)
    cost = ModelRuntime.block_bytes(model, config.block_size, dtype)
    sequence_bytes = drafter_sequence_bytes(config, model, dtype)
    num_blocks = blocks_per_group(config, cost.all_groups_block_bytes
                                  + drafter_block_bytes(config, model, dtype), sequence_bytes)
    groups = tuple(BlockGroupInfo(name, num_blocks, size, cost.group_windows[name])
                   for name, size in cost.group_block_bytes.items())
    return ModelFacts(
        vocab_size=model.vocab_size, eos_token_id=model.eos_token_id,
        model_fingerprint=model_fingerprint(model.fingerprint(),
                                            checkpoint_fingerprint(config.model_dir)),
        compute_dtype=dtype_name, block_groups=groups,
        cache_families=cache_families(model, config.block_size, cost),
        max_num_seqs=config.max_num_seqs if sequence_bytes else 0)


def drafter_block_bytes(config: WorkerConfig, model: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes one block costs in the drafter's paged cache: MTP speculation pages the MTP layer's
    rows with the target's block tables (mtp_drafter.py), so every block has them too. A DSpark
    draft keeps a bounded window per sequence instead (`drafter_sequence_bytes`): 0 here."""
    spec = config.speculative
    if spec is None or spec.num_speculative_tokens == 0 or spec.method != MTP_METHOD:
        return 0
    mtp_layer = range(model.num_hidden_layers, model.num_hidden_layers + 1)
    return ModelRuntime.block_bytes(model, config.block_size, dtype,
                                    mtp_layer).all_groups_block_bytes


def drafter_sequence_bytes(config: WorkerConfig, model: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes the drafter keeps outside the blocks: a DSpark draft holds each stage's main KV of
    the last `sliding_window` positions of every running sequence (dspark.py), for at most
    `--max-num-seqs` sequences. 0 without DSpark."""
    spec = config.speculative
    if spec is None or spec.num_speculative_tokens == 0 or spec.method != DSPARK_METHOD:
        return 0
    return window_bytes(model, dtype) * config.max_num_seqs


def cache_families(model: ModelConfig, block_size: int,
                   cost: BlockCost) -> tuple[CacheFamilyInfo, ...]:
    """Every family of the model with its rows per block, summed over the main layers."""
    ratios = [model.layer_ratio(i) for i in range(model.num_hidden_layers)]
    n_c4, n_c128 = ratios.count(4), ratios.count(128)
    rows = {"ori": len(ratios) * block_size, "cmp_c4": n_c4 * rows_per_block(block_size, 4),
            "cmp_c128": n_c128 * rows_per_block(block_size, 128),
            "idx": n_c4 * rows_per_block(block_size, 4), "csa_state": n_c4 * block_size,
            "csa_inner_state": n_c4 * block_size, "hca_state": n_c128 * block_size}
    return tuple(CacheFamilyInfo(name, FAMILY_GROUPS[name], rows[name], size)
                 for name, size in cost.family_block_bytes.items())
