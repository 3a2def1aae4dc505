"""Paged caches: the physical placement of blocks never changes results, released window blocks
are never read, and `block_bytes` describes the storage the runtime really allocates."""
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
NEW_TOKENS = 12       # decodes up to position 81: the window slides over several blocks


@pytest.fixture(scope="module")
def runtime(tiny_model_dir: Path) -> ModelRuntime:
    return ModelRuntime(RuntimeConfig(model_dir=tiny_model_dir, dtype=torch.float32, device="cpu",
                                      block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS,
                                      num_window_blocks=NUM_BLOCKS))


def prompt_of(length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(3, 120000, (length - 1,), generator=gen).tolist()


def releasable(next_pos: int, window: int) -> list[int]:
    """Logical window blocks whose rows no query from next_pos on can see."""
    return [i for i in range(next_pos // BLOCK_SIZE)
            if (i + 1) * BLOCK_SIZE <= next_pos - window + 1]


def decode_run(runtime: ModelRuntime, seq_id: int, prompt: list[int], table: list[int],
               window_table: list[int], after_step=None) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill + decodes; `after_step(next_pos)` runs between steps (to poison released blocks)."""
    out = runtime.step([SequenceChunk(seq_id, 0, prompt, table, window_table, sample=True)],
                       return_logits=True)
    tokens, logits = [out.sampled[0]], [out.logits[0]]
    while len(tokens) < NEW_TOKENS:
        pos = len(prompt) + len(tokens) - 1
        if after_step is not None:
            after_step(pos)
        out = runtime.step([SequenceChunk(seq_id, pos, [tokens[-1]], table, window_table,
                                          sample=True)], return_logits=True)
        tokens.append(out.sampled[0])
        logits.append(out.logits[0])
    runtime.free_sequence(seq_id)
    return tokens, logits


def test_shuffled_physical_blocks_give_the_same_output_as_contiguous(runtime: ModelRuntime) -> None:
    prompt = prompt_of(PROMPT_LEN, seed=11)
    n = math.ceil((PROMPT_LEN + NEW_TOKENS) / BLOCK_SIZE)
    contiguous = list(range(n))
    shuffled = random.Random(3).sample(range(NUM_BLOCKS), n)
    shuffled_window = random.Random(4).sample(range(NUM_BLOCKS), n)
    base_tokens, base_logits = decode_run(runtime, 1, prompt, contiguous, contiguous)
    tokens, logits = decode_run(runtime, 2, prompt, shuffled, shuffled_window)
    assert tokens == base_tokens
    for a, b in zip(logits, base_logits):
        assert torch.equal(a, b)


def test_released_window_blocks_are_never_read(runtime: ModelRuntime) -> None:
    prompt = prompt_of(PROMPT_LEN, seed=12)
    n = math.ceil((PROMPT_LEN + NEW_TOKENS) / BLOCK_SIZE)
    table = list(range(n))
    window_table = list(range(n, 2 * n))
    base_tokens, base_logits = decode_run(runtime, 1, prompt, table, window_table)
    window = runtime.config.sliding_window
    poisoned: set[int] = set()

    def poison_released(next_pos: int) -> None:
        for logical in releasable(next_pos, window):
            physical = window_table[logical]
            for storage in runtime.cache.window.values():
                storage[physical] = float("nan")
            poisoned.add(physical)

    tokens, logits = decode_run(runtime, 2, prompt, table, window_table, poison_released)
    assert poisoned, "the run never released a window block"
    assert tokens == base_tokens
    for a, b in zip(logits, base_logits):
        assert torch.equal(a, b)


def test_released_window_blocks_can_serve_another_sequence(runtime: ModelRuntime) -> None:
    """Sequence A's released window blocks are handed to B, which overwrites them meanwhile."""
    window = runtime.config.sliding_window
    prompt_a, prompt_b = prompt_of(PROMPT_LEN, seed=13), prompt_of(30, seed=14)
    n = math.ceil((PROMPT_LEN + NEW_TOKENS) / BLOCK_SIZE)
    table_a, window_a = list(range(n)), list(range(n, 2 * n))
    alone_tokens, _ = decode_run(runtime, 1, prompt_a, table_a, window_a)

    # A prefills; its released window blocks become B's window blocks; both then decode together.
    out = runtime.step([SequenceChunk(1, 0, prompt_a, table_a, window_a, sample=True)])
    tokens_a = [out.sampled[0]]
    recycled = [window_a[i] for i in releasable(PROMPT_LEN, window)]
    spare = list(range(2 * n, NUM_BLOCKS))
    b_blocks = math.ceil((30 + NEW_TOKENS) / BLOCK_SIZE)
    window_b = (recycled + spare)[:b_blocks]
    table_b = spare[-b_blocks:]
    assert set(window_b) & set(window_a), "B must reuse A's released blocks"
    out = runtime.step([SequenceChunk(2, 0, prompt_b, table_b, window_b, sample=True)])
    tokens_b = [out.sampled[0]]
    while len(tokens_a) < NEW_TOKENS:
        pos_a = PROMPT_LEN + len(tokens_a) - 1
        pos_b = 30 + len(tokens_b) - 1
        out = runtime.step([
            SequenceChunk(1, pos_a, [tokens_a[-1]], table_a, window_a, sample=True),
            SequenceChunk(2, pos_b, [tokens_b[-1]], table_b, window_b, sample=True)])
        tokens_a.append(out.sampled[0])
        tokens_b.append(out.sampled[1])
    runtime.free_sequence(1)
    runtime.free_sequence(2)
    assert tokens_a == alone_tokens


def test_block_bytes_matches_the_allocated_storage(runtime: ModelRuntime) -> None:
    cost = ModelRuntime.block_bytes(runtime.config, BLOCK_SIZE, torch.float32)
    cache = runtime.cache
    window_bytes = sum(t.numel() * t.element_size() for t in cache.window.values())
    compressed_bytes = sum(t.numel() * t.element_size()
                           for t in [*cache.entries.values(), *cache.index_keys.values()])
    assert window_bytes == NUM_BLOCKS * cost.window_block_bytes
    assert compressed_bytes == NUM_BLOCKS * cost.compressed_block_bytes
    assert cost.compressed_block_bytes == sum(
        cost.family_block_bytes[f] for f in ("cmp_c4", "cmp_c128", "idx"))


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
    assert cost.per_sequence_state_bytes > 0
