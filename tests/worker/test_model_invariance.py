"""The forward pass gives the same answer however the scheduler slices and batches the work.

- Chunking: one prefill chunk, chunks of 32, chunks of 7 → the same greedy tokens, logits ≤ 1e-4.
- Batching: a request alone and the same request inside a batch of 8 mixed requests (different
  lengths, some prefilling while others decode) → identical greedy tokens.
- Blocks that held other rows (a finished or restarted sequence) leak nothing into a new one.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
from tests.worker.chunked_runs import prefill_and_decode

BLOCK_SIZE = 16
BLOCKS_PER_SEQ = 12         # 192 positions
NUM_SEQS = 9


@pytest.fixture(scope="module")
def runtime(tiny_model_dir: Path) -> ModelRuntime:
    blocks = BLOCKS_PER_SEQ * NUM_SEQS
    return ModelRuntime(RuntimeConfig(model_dir=tiny_model_dir, dtype=torch.float32, device="cpu",
                                      block_size=BLOCK_SIZE, num_blocks=blocks))


def tables_for(runtime: ModelRuntime, slot: int) -> dict[str, list[int]]:
    """A private, non-contiguous run of physical blocks for sequence slot `slot`, every group."""
    return runtime.cache.same_table_for_every_group(
        [b * NUM_SEQS + slot for b in range(BLOCKS_PER_SEQ)])


def prompt_of(length: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(3, 120000, (length - 1,), generator=gen).tolist()


def generate(runtime: ModelRuntime, seq_id: int, slot: int, prompt: list[int], chunk: int,
             new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Chunked prefill then single-token decodes → (greedy tokens, logits of every sampled step)."""
    return prefill_and_decode(runtime, seq_id, prompt, tables_for(runtime, slot), chunk,
                              new_tokens)


def test_chunked_prefill_matches_one_chunk(runtime: ModelRuntime) -> None:
    # 141 tokens: crosses the window (16), many ratio-4 blocks and the first ratio-128 entry.
    prompt = prompt_of(141, seed=7)
    whole_tokens, whole_logits = generate(runtime, 1, 0, prompt, chunk=len(prompt), new_tokens=6)
    for chunk in (32, 7):
        tokens, logits = generate(runtime, 2, 1, prompt, chunk=chunk, new_tokens=6)
        assert tokens == whole_tokens, f"chunk {chunk}"
        for step, (a, b) in enumerate(zip(logits, whole_logits)):
            assert float((a - b).abs().max()) <= 1e-4, f"chunk {chunk}, step {step}"


def test_request_alone_matches_request_inside_a_mixed_batch(runtime: ModelRuntime) -> None:
    lengths = [5, 23, 37, 64, 90, 130, 3, 150]
    prompts = [prompt_of(n, seed=100 + i) for i, n in enumerate(lengths)]
    new_tokens = 8
    alone = [generate(runtime, 10 + i, i, p, chunk=len(p), new_tokens=new_tokens)[0]
             for i, p in enumerate(prompts)]

    # A small scheduler: request i joins at step i; prefill in chunks of 24 tokens.
    done_tokens: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    computed = {i: 0 for i in range(len(prompts))}
    step_no = 0
    saw_mixed_step = False
    while any(len(t) < new_tokens for t in done_tokens.values()):
        rows, owners = [], []
        for i, prompt in enumerate(prompts):
            if i > step_no or len(done_tokens[i]) >= new_tokens:
                continue
            tables = tables_for(runtime, i)
            if computed[i] < len(prompt):
                piece = prompt[computed[i]:computed[i] + 24]
                last = computed[i] + len(piece) == len(prompt)
                rows.append(SequenceChunk(20 + i, computed[i], piece, tables, sample=last))
            else:
                pos = len(prompt) + len(done_tokens[i]) - 1
                rows.append(SequenceChunk(20 + i, pos, [done_tokens[i][-1]], tables,
                                          sample=True))
            owners.append(i)
        lens = {len(r.token_ids) for r in rows}
        saw_mixed_step |= 1 in lens and len(lens) > 1
        out = runtime.step(rows)
        for row, i, token in zip(rows, owners, out.sampled):
            computed[i] = row.start_pos + len(row.token_ids)
            if token is not None:
                done_tokens[i].append(token)
        step_no += 1
    assert saw_mixed_step, "the batch never mixed prefill chunks with decode rows"
    assert [done_tokens[i] for i in range(len(prompts))] == alone


def test_blocks_of_an_earlier_sequence_start_from_clean_state(runtime: ModelRuntime) -> None:
    """Blocks that held another sequence's rows: a new sequence in them reads none of those."""
    short = prompt_of(3, seed=5)     # shorter than one compression block
    fresh_tokens, fresh_logits = generate(runtime, 40, 0, short, chunk=3, new_tokens=3)
    generate(runtime, 41, 1, prompt_of(50, seed=6), chunk=50, new_tokens=2)
    reused_tokens, reused_logits = generate(runtime, 42, 1, short, chunk=3, new_tokens=3)
    assert reused_tokens == fresh_tokens
    assert torch.equal(reused_logits[0], fresh_logits[0])


def test_restart_at_position_zero_drops_the_old_state(runtime: ModelRuntime) -> None:
    """A sequence recomputed from position 0 (preemption) must not see its old compressor rows."""
    short = prompt_of(3, seed=5)
    tables = tables_for(runtime, 2)
    fresh = runtime.step([SequenceChunk(42, 0, short, tables, sample=True)],
                         return_logits=True)
    runtime.step([SequenceChunk(42, 0, prompt_of(50, seed=6), tables, sample=False)])
    restarted = runtime.step([SequenceChunk(42, 0, short, tables, sample=True)],
                             return_logits=True)
    assert torch.equal(restarted.logits[0], fresh.logits[0])
