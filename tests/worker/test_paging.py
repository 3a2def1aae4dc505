"""Paged caches: the physical placement of blocks never changes results, released blocks of the
windowed groups are never read, and `block_bytes` describes the storage the runtime really
allocates."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from services.worker.model.config import ModelConfig
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk

BLOCK_SIZE = 16
NUM_BLOCKS = 40
PROMPT_LEN = 70
NEW_TOKENS = 16       # decodes up to position 85: windows slide over several blocks, and the
                      # pooling at 83 reads the ratio-4 rows 76..79 of the block before


@pytest.fixture(scope="module")
def runtime(tiny_model_dir: Path) -> ModelRuntime:
    return ModelRuntime(RuntimeConfig(model_dir=tiny_model_dir, dtype=torch.float32, device="cpu",
                                      block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))


def prompt_of(length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(3, 120000, (length - 1,), generator=gen).tolist()


def releasable(next_pos: int, window: int) -> list[int]:
    """Logical blocks of a group with `window` whose rows no query from next_pos on can see."""
    return [i for i in range(next_pos // BLOCK_SIZE)
            if (i + 1) * BLOCK_SIZE <= next_pos - window + 1]


def disjoint_tables(runtime: ModelRuntime, blocks: list[int], per_seq: int) -> dict[str, list[int]]:
    """Each group's table from its own slice of `blocks`."""
    groups = list(runtime.cache.group_windows)
    return {group: blocks[k * per_seq:(k + 1) * per_seq] for k, group in enumerate(groups)}


def decode_run(runtime: ModelRuntime, seq_id: int, prompt: list[int], tables: dict[str, list[int]],
               after_step=None) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill + decodes; `after_step(next_pos)` runs between steps (to poison released blocks)."""
    out = runtime.step([SequenceChunk(seq_id, 0, prompt, tables, sample=True)],
                       return_logits=True)
    tokens, logits = [out.sampled[0]], [out.logits[0]]
    while len(tokens) < NEW_TOKENS:
        pos = len(prompt) + len(tokens) - 1
        if after_step is not None:
            after_step(pos)
        out = runtime.step([SequenceChunk(seq_id, pos, [tokens[-1]], tables, sample=True)],
                           return_logits=True)
        tokens.append(out.sampled[0])
        logits.append(out.logits[0])
    return tokens, logits


def test_shuffled_physical_blocks_give_the_same_output_as_contiguous(runtime: ModelRuntime) -> None:
    prompt = prompt_of(PROMPT_LEN, seed=11)
    n = math.ceil((PROMPT_LEN + NEW_TOKENS) / BLOCK_SIZE)
    groups = len(runtime.cache.group_windows)
    contiguous = runtime.cache.same_table_for_every_group(list(range(n)))
    shuffled = disjoint_tables(runtime, random.Random(3).sample(range(NUM_BLOCKS), n * groups), n)
    base_tokens, base_logits = decode_run(runtime, 1, prompt, contiguous)
    tokens, logits = decode_run(runtime, 2, prompt, shuffled)
    assert tokens == base_tokens
    for a, b in zip(logits, base_logits):
        assert torch.equal(a, b)


def test_released_blocks_of_windowed_groups_are_never_read(runtime: ModelRuntime) -> None:
    """Raw window rows and compressor rows older than their group's window: poisoned, unread."""
    prompt = prompt_of(PROMPT_LEN, seed=12)
    n = math.ceil((PROMPT_LEN + NEW_TOKENS) / BLOCK_SIZE)
    tables = disjoint_tables(runtime, list(range(NUM_BLOCKS)), n)
    base_tokens, base_logits = decode_run(runtime, 1, prompt, tables)
    poisoned: set[tuple[str, int]] = set()

    def poison_released(next_pos: int) -> None:
        for group, window in runtime.cache.group_windows.items():
            for logical in releasable(next_pos, window) if window else []:
                for storage in runtime.cache.storage(group):
                    storage[tables[group][logical]] = float("nan")
                poisoned.add((group, logical))

    tokens, logits = decode_run(runtime, 2, prompt, tables, poison_released)
    assert {group for group, _ in poisoned} >= {"window", "csa_state"}, poisoned
    assert tokens == base_tokens
    for a, b in zip(logits, base_logits):
        assert torch.equal(a, b)


def test_released_window_blocks_can_serve_another_sequence(runtime: ModelRuntime) -> None:
    """Sequence A's released window blocks are handed to B, which overwrites them meanwhile."""
    window = runtime.config.sliding_window
    prompt_a, prompt_b = prompt_of(PROMPT_LEN, seed=13), prompt_of(30, seed=14)
    n = math.ceil((PROMPT_LEN + NEW_TOKENS) / BLOCK_SIZE)
    window_a = list(range(n, 2 * n))
    tables_a = {**runtime.cache.same_table_for_every_group(list(range(n))), "window": window_a}
    alone_tokens, _ = decode_run(runtime, 1, prompt_a, tables_a)

    # A prefills; its released window blocks become B's window blocks; both then decode together.
    out = runtime.step([SequenceChunk(1, 0, prompt_a, tables_a, sample=True)])
    tokens_a = [out.sampled[0]]
    recycled = [window_a[i] for i in releasable(PROMPT_LEN, window)]
    spare = list(range(2 * n, NUM_BLOCKS))
    b_blocks = math.ceil((30 + NEW_TOKENS) / BLOCK_SIZE)
    window_b = (recycled + spare)[:b_blocks]
    tables_b = {**runtime.cache.same_table_for_every_group(spare[-b_blocks:]), "window": window_b}
    assert set(window_b) & set(window_a), "B must reuse A's released blocks"
    out = runtime.step([SequenceChunk(2, 0, prompt_b, tables_b, sample=True)])
    tokens_b = [out.sampled[0]]
    while len(tokens_a) < NEW_TOKENS:
        pos_a = PROMPT_LEN + len(tokens_a) - 1
        pos_b = 30 + len(tokens_b) - 1
        out = runtime.step([
            SequenceChunk(1, pos_a, [tokens_a[-1]], tables_a, sample=True),
            SequenceChunk(2, pos_b, [tokens_b[-1]], tables_b, sample=True)])
        tokens_a.append(out.sampled[0])
        tokens_b.append(out.sampled[1])
    assert tokens_a == alone_tokens


def test_block_bytes_matches_the_allocated_storage(runtime: ModelRuntime) -> None:
    cost = ModelRuntime.block_bytes(runtime.config, BLOCK_SIZE, torch.float32)
    assert set(cost.group_block_bytes) == set(runtime.cache.group_windows)
    for group, per_block in cost.group_block_bytes.items():
        allocated = sum(t.numel() * t.element_size() for t in runtime.cache.storage(group))
        assert allocated == NUM_BLOCKS * per_block, group
    assert cost.group_windows == runtime.cache.group_windows


def test_block_bytes_of_the_flash_shape() -> None:
    """V4-Flash, bf16, 32-token blocks: 43 layers of 512-wide raw rows per window block."""
    flash = ModelConfig.from_dict({
        "model_type": "deepseek_v4", "hidden_size": 4096, "num_hidden_layers": 43,
        "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64,
        "num_key_value_heads": 1, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
        "vocab_size": 129280, "bos_token_id": 0, "eos_token_id": 1, "rms_norm_eps": 1e-6,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
        "moe_intermediate_size": 2048, "scoring_func": "sqrtsoftplus",
        "routed_scaling_factor": 1.5, "num_hash_layers": 3, "swiglu_limit": 10.0,
        "sliding_window": 128, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rope_theta": 10000,
        "compress_rope_theta": 160000, "max_position_embeddings": 1048576,
        "num_nextn_predict_layers": 1, "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0]})
    cost = ModelRuntime.block_bytes(flash, 32, torch.bfloat16)
    assert cost.family_block_bytes["ori"] == 43 * 32 * 512 * 2
    assert cost.family_block_bytes["cmp_c4"] == 21 * 8 * 512 * 2      # 21 ratio-4 layers
    assert cost.family_block_bytes["cmp_c128"] == 20 * 1 * 512 * 2    # one row per block
    assert cost.family_block_bytes["idx"] == 21 * 8 * 128 * 2
    # Compressor rows: fp32 kv + score per token, 2c wide with overlap.
    assert cost.family_block_bytes["csa_state"] == 21 * 32 * 2 * 1024 * 4
    assert cost.family_block_bytes["csa_inner_state"] == 21 * 32 * 2 * 256 * 4
    assert cost.family_block_bytes["hca_state"] == 20 * 32 * 2 * 512 * 4
    assert cost.group_windows == {"window": 128, "compressed": 0, "csa_state": 8,
                                  "hca_state": 128}
