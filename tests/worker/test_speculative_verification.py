"""Verification and commit in the model runtime, with the oracle drafter.

A decode row is the anchor plus K drafts, verified in one target pass: the longest prefix the
target's greedy argmax agrees with is accepted, plus the bonus token. The committed tokens equal a
K=0 run's, and so do the cache rows of every committed position — raw window rows, ratio-4 and
ratio-128 compressor rows, compressed entries and indexer keys — although the draft windows cross
ratio-4 boundaries and the ratio-128 boundary at position 128. Rows written for rejected drafts are
never read: poisoning every row past the committed length with NaN after each step changes no bit.
(A multi-token row is not bit-identical to single-token decodes on CPU: rows of decoded positions
agree with the K=0 run to 1e-5, the tolerance chunked prefill has too.)
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.worker.model.kv_cache import COMPRESSED, STATE_GROUPS, WINDOW, PagedKvCache
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
from tests.worker.chunked_runs import prefill_and_decode
from tests.worker.oracle_drafter import OracleDrafter

BLOCK_SIZE = 32
BLOCKS_PER_SEQ = 6          # 192 positions
PROMPT_LEN = 101            # decodes cross entries at 104, ..., and the ratio-128 entry at 127
NEW_TOKENS = 40
K = 7


@pytest.fixture(scope="module")
def runtime(tiny_model_dir: Path) -> ModelRuntime:
    return ModelRuntime(RuntimeConfig(model_dir=tiny_model_dir, dtype=torch.float32, device="cpu",
                                      block_size=BLOCK_SIZE, num_blocks=3 * BLOCKS_PER_SEQ))


def tables_of(runtime: ModelRuntime, slot: int) -> dict[str, list[int]]:
    ids = list(range(slot * BLOCKS_PER_SEQ, (slot + 1) * BLOCKS_PER_SEQ))
    return runtime.cache.same_table_for_every_group(ids)


@pytest.fixture(scope="module")
def reference(runtime: ModelRuntime) -> tuple[list[int], list[int]]:
    """The K=0 run in slot 0 → (prompt + outputs by position, outputs)."""
    gen = torch.Generator().manual_seed(5)
    prompt = [0] + torch.randint(3, 120000, (PROMPT_LEN - 1,), generator=gen).tolist()
    outputs, _ = prefill_and_decode(runtime, 1, prompt, tables_of(runtime, 0), 64, NEW_TOKENS)
    return prompt + outputs, outputs


def speculate(runtime: ModelRuntime, seq_id: int, tokens: list[int], slot: int,
              drafter: OracleDrafter, max_tokens: int, poison: bool = False
              ) -> tuple[list[int], list[int]]:
    """Prefill the prompt, then verify rows of anchor + K proposals → (outputs, accepted per
    verify step)."""
    runtime.drafter = drafter
    tables = tables_of(runtime, slot)
    prompt = tokens[:PROMPT_LEN]
    out = runtime.step([SequenceChunk(seq_id, 0, prompt, tables, sample=True, num_proposals=K)])
    outputs, proposals, accepted = [out.sampled[0]], out.proposals[0], []
    while len(outputs) < max_tokens:
        pos = PROMPT_LEN + len(outputs) - 1
        chunk = SequenceChunk(seq_id, pos, [outputs[-1]] + proposals, tables, sample=True,
                              num_drafts=len(proposals), num_proposals=K)
        out = runtime.step([chunk])
        accepted.append(out.num_accepted[0])
        outputs += proposals[:out.num_accepted[0]] + [out.sampled[0]]
        proposals = out.proposals[0]
        if poison:
            poison_past(runtime.cache, tables, PROMPT_LEN + len(outputs) - 1)
    runtime.drafter = None
    return outputs, accepted


def poison_past(cache: PagedKvCache, tables: dict[str, list[int]], length: int) -> None:
    """NaN into every row of the sequence's blocks past the committed `length` positions."""
    bs = cache.block_size
    positions = torch.arange(length, len(tables[WINDOW]) * bs)
    window = torch.tensor(tables[WINDOW])
    for store in cache.window.values():
        store[window[positions // bs], positions % bs] = float("nan")
    for (layer_id, _), store in cache.compressor_rows.items():
        table = torch.tensor(tables[STATE_GROUPS[cache._layer_ratios[layer_id]]])
        store[table[positions // bs], positions % bs] = float("nan")
    compressed = torch.tensor(tables[COMPRESSED])
    for stores in (cache.entries, cache.index_keys):
        for layer_id, store in stores.items():
            ratio = cache._layer_ratios[layer_id]
            first, end = length // ratio, len(tables[COMPRESSED]) * bs // ratio
            blocks, rows = cache._entry_slots(compressed, first, end - first, ratio)
            store[blocks, rows] = float("nan")


def committed_rows(cache: PagedKvCache, tables: dict[str, list[int]], length: int
                   ) -> dict[str, torch.Tensor]:
    """Every cache row of positions [0, length) of one sequence, by family and layer."""
    bs = cache.block_size
    positions = torch.arange(length)
    rows: dict[str, torch.Tensor] = {}
    window = torch.tensor(tables[WINDOW])
    for layer_id, store in cache.window.items():
        rows[f"ori{layer_id}"] = store[window[positions // bs], positions % bs]
    for (layer_id, name), store in cache.compressor_rows.items():
        table = torch.tensor(tables[STATE_GROUPS[cache._layer_ratios[layer_id]]])
        rows[f"state{layer_id}{name}"] = store[table[positions // bs], positions % bs]
    compressed = torch.tensor(tables[COMPRESSED])
    for kind, stores in (("cmp", cache.entries), ("idx", cache.index_keys)):
        for layer_id, store in stores.items():
            ratio = cache._layer_ratios[layer_id]
            rows[f"{kind}{layer_id}"] = cache.read_entries(store, compressed, length // ratio,
                                                           ratio)
    return rows


def test_full_acceptance_commits_k_plus_one_tokens_per_step(runtime, reference):
    tokens, outputs = reference
    got, accepted = speculate(runtime, 2, tokens, 1, OracleDrafter({2: tokens}), 33)
    assert accepted == [K] * 4
    assert got == outputs[:33]


@pytest.mark.parametrize("corrupt_at", [0, 3, 6])
def test_corruption_at_j_accepts_exactly_j_drafts_and_the_bonus(runtime, reference, corrupt_at):
    tokens, outputs = reference
    got, accepted = speculate(runtime, 3, tokens, 1, OracleDrafter({3: tokens}, corrupt_at),
                              NEW_TOKENS - K)
    assert set(accepted) == {corrupt_at}
    assert got[:NEW_TOKENS - K] == outputs[:NEW_TOKENS - K]


def test_caches_after_a_speculative_run_equal_a_k0_run(runtime, reference):
    """Partial acceptance puts draft windows across ratio-4 boundaries and position 127 (the
    ratio-128 entry)."""
    tokens, outputs = reference
    got, _ = speculate(runtime, 4, tokens, 1, OracleDrafter({4: tokens}, corrupt_at=5), 30)
    poisoned, _ = speculate(runtime, 5, tokens, 2, OracleDrafter({5: tokens}, corrupt_at=5), 30,
                            poison=True)
    assert poisoned == got == outputs[:len(got)]
    committed = PROMPT_LEN + len(got) - 1  # the last output is the next anchor, not yet cached
    assert committed > 128
    spec = committed_rows(runtime.cache, tables_of(runtime, 1), committed)
    after_poison = committed_rows(runtime.cache, tables_of(runtime, 2), committed)
    ref = committed_rows(runtime.cache, tables_of(runtime, 0), committed)
    for name, rows in ref.items():
        assert torch.equal(after_poison[name], spec[name]), name
        assert torch.allclose(spec[name], rows, rtol=0, atol=1e-5), name
