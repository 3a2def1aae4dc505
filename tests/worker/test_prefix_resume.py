"""A sequence resumed from another sequence's cached blocks continues exactly as the cold run.

The resumed sequence shares the cold run's blocks for positions [0, H) — the whole-sequence group
from block 0, each windowed group only from the first block its window needs (older entries are
-1, which would read the poisoned last block) — and computes from H on in fresh blocks. At every
128 boundary H of a 1,000-token prompt its logits equal the cold run's within 1e-5 and its greedy
tokens are the same. Rows written past the committed length (rejected drafts) are never read.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.worker.model.kv_cache import first_needed_block
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
from tests.worker.chunked_runs import prefill_and_decode

BLOCK_SIZE = 32
PROMPT_LEN = 1000
CHUNK = 128
NEW_TOKENS = 6               # decodes cross a ratio-4 entry (positions 1000..1003)
BLOCKS_PER_SEQ = 33             # 1,056 positions
NUM_BLOCKS = 2 * BLOCKS_PER_SEQ + 1
POISONED = NUM_BLOCKS - 1       # what a -1 table entry would read


@pytest.fixture(scope="module")
def runtime(tiny_model_dir: Path) -> ModelRuntime:
    runtime = ModelRuntime(RuntimeConfig(model_dir=tiny_model_dir, dtype=torch.float32,
                                         device="cpu", block_size=BLOCK_SIZE,
                                         num_blocks=NUM_BLOCKS))
    for group in runtime.cache.group_windows:
        for storage in runtime.cache.storage(group):
            storage[POISONED] = float("nan")
    return runtime


def prompt_of(length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(3, 120000, (length - 1,), generator=gen).tolist()


def run_from(runtime: ModelRuntime, seq_id: int, tokens: list[int], start: int,
             tables: dict[str, list[int]]) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill tokens[start:] in 128-token chunks, then greedy decodes → (tokens, logits)."""
    return prefill_and_decode(runtime, seq_id, tokens, tables, CHUNK, NEW_TOKENS, start)


def resumed_tables(runtime: ModelRuntime, cold: list[int], fresh: list[int], hit: int
                   ) -> dict[str, list[int]]:
    """The tables of a sequence that hits the cold run's blocks for positions [0, hit)."""
    k = hit // BLOCK_SIZE
    tables = {}
    for group, window in runtime.cache.group_windows.items():
        first = first_needed_block(window, hit, BLOCK_SIZE)
        tables[group] = [-1] * first + cold[first:k] + fresh[k:]
    return tables


@pytest.fixture(scope="module")
def cold(runtime: ModelRuntime) -> tuple[list[int], list[int], list[torch.Tensor]]:
    prompt = prompt_of(PROMPT_LEN, seed=21)
    tokens, logits = run_from(runtime, 1, prompt, 0, runtime.cache.same_table_for_every_group(
        list(range(BLOCKS_PER_SEQ))))
    return prompt, tokens, logits


@pytest.mark.parametrize("hit", range(CHUNK, PROMPT_LEN, CHUNK))
def test_resume_at_a_128_boundary_matches_the_cold_run(runtime, cold, hit: int) -> None:
    prompt, cold_tokens, cold_logits = cold
    fresh = list(range(BLOCKS_PER_SEQ, 2 * BLOCKS_PER_SEQ))
    tables = resumed_tables(runtime, list(range(BLOCKS_PER_SEQ)), fresh, hit)
    tokens, logits = run_from(runtime, 2, prompt, hit, tables)
    assert tokens == cold_tokens
    for step, (a, b) in enumerate(zip(logits, cold_logits)):
        assert float((a - b).abs().max()) <= 1e-5, f"hit {hit}, step {step}"


def test_rows_written_past_the_committed_length_are_never_read(runtime, cold) -> None:
    """Seven rejected draft tokens written after position 999, then the real decode from there."""
    prompt, cold_tokens, cold_logits = cold
    fresh = list(range(BLOCKS_PER_SEQ, 2 * BLOCKS_PER_SEQ))
    tables = resumed_tables(runtime, list(range(BLOCKS_PER_SEQ)), fresh, 896)
    out = runtime.step([SequenceChunk(3, 896, prompt[896:], tables, sample=True)])
    assert out.sampled[0] == cold_tokens[0]
    drafts = [cold_tokens[0]] + [(7919 * i) % 120000 + 3 for i in range(1, 8)]
    runtime.step([SequenceChunk(3, PROMPT_LEN, drafts, tables, sample=False)])
    tokens = [cold_tokens[0]]
    for pos in range(PROMPT_LEN, PROMPT_LEN + NEW_TOKENS - 1):
        out = runtime.step([SequenceChunk(3, pos, [tokens[-1]], tables, sample=True)],
                           return_logits=True)
        assert float((out.logits[0] - cold_logits[len(tokens)]).abs().max()) <= 1e-5
        tokens.append(out.sampled[0])
    assert tokens == cold_tokens


@pytest.mark.parametrize("hit", [96, 160])
def test_a_resumed_sequence_never_writes_the_blocks_it_shares(runtime, cold, hit: int) -> None:
    """A sequence diverging after a 32-aligned (not 128-aligned) hit: the shared blocks keep their
    bytes in every group (a ratio-128 entry completed after the hit goes to a fresh block)."""
    prompt, _, _ = cold
    shared = list(range(hit // BLOCK_SIZE))
    before = {group: [t[shared].clone() for t in runtime.cache.storage(group)]
              for group in runtime.cache.group_windows}
    fresh = list(range(BLOCKS_PER_SEQ, 2 * BLOCKS_PER_SEQ))
    tables = resumed_tables(runtime, list(range(BLOCKS_PER_SEQ)), fresh, hit)
    diverged = prompt[:hit] + prompt_of(200, seed=hit)
    run_from(runtime, 4, diverged, hit, tables)
    for group, tensors in before.items():
        for kept, now in zip(tensors, runtime.cache.storage(group)):
            assert torch.equal(kept, now[shared]), group
