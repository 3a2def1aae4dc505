"""The masked argmax against an independent reference, in both mask layouts.

The reference is plain Python over a set of allowed ids: add the bias, keep the allowed ids, take
the largest score, the lowest id among equal scores. Logits and biases are small multiples of 1/4,
so float32 sums are exact (the reference and the sampler cannot disagree by rounding) and ties are
frequent. Bitmasks are packed here with numpy (`packbits`, little bit order, little-endian int32
words), independently of the sampler's own unpacking.
"""
from __future__ import annotations

import random
from typing import Optional

import numpy as np
import pytest
import torch

from services.common.step_descriptors import TokenMask
from services.worker.row_masks import RowError, decode_token_mask
from services.worker.model.sampling import greedy_rows

# Vocabulary sizes around word boundaries: one partial word, exact words, a partial last word.
VOCAB_SIZES = (1, 5, 31, 32, 33, 63, 64, 65, 100, 129)
CASES = 400


def reference_choice(logits: list[float], allowed: set[int],
                     bias: dict[int, float]) -> Optional[int]:
    """argmax over the allowed ids of logits + bias, lowest id on ties; None when none allowed."""
    best: Optional[int] = None
    for token in sorted(t for t in allowed if 0 <= t < len(logits)):
        score = logits[token] + bias.get(token, 0.0)
        if best is None or score > logits[best] + bias.get(best, 0.0):
            best = token
    return best


def pack_bitmask(allowed: set[int], vocab: int, junk_past_vocab: bool = False) -> bytes:
    """XGrammar layout as bytes: bit i of little-endian int32 word w allows token 32·w + i."""
    bits = np.zeros(32 * ((vocab + 31) // 32), dtype=bool)
    bits[sorted(allowed)] = True
    if junk_past_vocab:
        bits[vocab:] = True        # bits past the vocabulary must never be chosen
    return np.packbits(bits, bitorder="little").tobytes()


def words_of(mask_bytes: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(mask_bytes, dtype="<i4").astype(np.int32))


def sample(logits: list[float], allowed: Optional[set[int]], form: str,
           bias: dict[int, float], junk_past_vocab: bool = False) -> Optional[int]:
    """One row sampled as a batch of one (None: its mask allows nothing)."""
    vocab = len(logits)
    bias_arg = bias_tensors(bias)
    ids = words = None
    if allowed is not None and form in ("ids", "both"):
        ids = torch.tensor(sorted(allowed), dtype=torch.int64)
    if allowed is not None and form in ("bitmask", "both"):
        words = words_of(pack_bitmask(allowed, vocab, junk_past_vocab))
    return greedy_rows(torch.tensor([logits], dtype=torch.float32), [(ids, words)], [bias_arg])[0]


def random_case(rng: random.Random) -> tuple[list[float], set[int], dict[int, float]]:
    vocab = rng.choice(VOCAB_SIZES)
    logits = [rng.randint(-8, 8) / 4 for _ in range(vocab)]
    density = rng.choice((0.0, 1 / vocab, 0.1, 0.5, 0.9, 1.0))
    allowed = {t for t in range(vocab) if rng.random() < density}
    if rng.random() < 0.3:    # a word's edge bits: 0 and 31
        allowed |= {t for t in range(vocab) if t % 32 in (0, 31) and rng.random() < 0.5}
    bias = {rng.randrange(vocab): rng.randint(-12, 12) / 4 for _ in range(rng.randint(0, 3))}
    return logits, allowed, bias


@pytest.mark.parametrize("form", ["ids", "bitmask", "both"])
def test_random_masks_choose_the_reference_argmax(form: str) -> None:
    rng = random.Random(f"masked-argmax-{form}")
    for case in range(CASES):
        logits, allowed, bias = random_case(rng)
        junk = form == "bitmask" and case % 2 == 0
        expected = reference_choice(logits, allowed, bias)
        assert sample(logits, allowed, form, bias, junk) == expected, (logits, allowed, bias)


@pytest.mark.parametrize("form", ["ids", "bitmask"])
def test_the_unmasked_winner_is_refused_when_only_its_neighbours_are_allowed(form: str) -> None:
    vocab = 70                                     # every bit position of two words and a partial one
    for top in range(vocab):
        logits = [float(t % 7) / 4 for t in range(vocab)]
        logits[top] = 10.0
        allowed = {t for t in (top - 1, top + 1) if 0 <= t < vocab}
        chosen = sample(logits, allowed, form, {})
        assert chosen != top and chosen == reference_choice(logits, allowed, {}), top


@pytest.mark.parametrize("form", ["ids", "bitmask"])
def test_a_word_edge_token_is_chosen_when_it_alone_is_allowed(form: str) -> None:
    vocab = 100                                    # last word holds 4 real tokens
    for token in (0, 31, 32, 63, 64, 95, 96, 99):
        logits = [1.0] * vocab
        logits[(token + 1) % vocab] = 5.0          # the unmasked winner sits next to it
        assert sample(logits, {token}, form, {}) == token


def test_bias_is_added_before_the_mask() -> None:
    logits = [0.0, 1.0, 2.0, 3.0]
    # Lifting a forbidden token changes nothing; lifting an allowed one makes it win.
    for form in ("ids", "bitmask"):
        assert sample(logits, {1, 2}, form, {0: 10.0}) == 2
        assert sample(logits, {1, 2}, form, {1: 1.5}) == 1
        assert sample(logits, {1, 2}, form, {2: -5.0}) == 1
    assert sample(logits, None, "ids", {3: -2.0}) == 2


def test_ties_go_to_the_lowest_allowed_id() -> None:
    logits = [0.0, 2.0, 2.0, 0.0, 2.0] + [0.0] * 60
    for form in ("ids", "bitmask"):
        assert sample(logits, {4, 2}, form, {}) == 2
        assert sample(logits, {4, 33}, form, {33: 2.0}) == 4
    assert sample(logits, None, "ids", {}) == 1


@pytest.mark.parametrize("vocab", [33, 64, 100])
def test_every_mask_form_samples_the_reference_argmax(vocab: int) -> None:
    """Scheduler bytes → `decode_token_mask` → sampler: the three TokenMask forms of one set of
    allowed tokens sample the same token, the reference one."""
    rng = random.Random(vocab)
    for _ in range(100):
        logits = [rng.randint(-8, 8) / 4 for _ in range(vocab)]
        allowed = {t for t in range(vocab) if rng.random() < rng.choice((0.05, 0.5, 0.95))}
        refused = tuple(t for t in range(vocab) if t not in allowed)
        forms = [TokenMask(allowed_token_ids=tuple(sorted(allowed))),
                 TokenMask(bitmask=pack_bitmask(allowed, vocab))]
        for mask in forms + ([TokenMask(refused_token_ids=refused)] if refused else []):
            if not allowed:
                with pytest.raises(RowError, match="allows no token"):
                    decode_token_mask(mask, vocab)
                continue
            ids, words = decode_token_mask(mask, vocab)
            chosen = greedy_rows(torch.tensor([logits]), [(ids, words)], [None])[0]
            assert chosen == reference_choice(logits, allowed, {})


def test_decoded_bitmask_keeps_bit_31_and_ignores_bits_past_the_vocabulary() -> None:
    vocab = 40
    _, words = decode_token_mask(TokenMask(bitmask=pack_bitmask({31, 39}, vocab, True)), vocab)
    assert words.dtype == torch.int32 and words.tolist() == [-(1 << 31), -(1 << 7)]
    logits = torch.zeros(vocab)
    logits[39] = -1.0
    assert greedy_rows(logits.unsqueeze(0), [(None, words)], [None]) == [31]


@pytest.mark.parametrize("layout", ["rows", "head"])
@pytest.mark.parametrize("vocab", [65, 129, 5000])
def test_one_batch_of_mixed_forms_and_densities_samples_every_row_like_the_reference(
        vocab: int, layout: str) -> None:
    """Rows of one step in one batch: unconstrained, allowed ids, bitmask (winner allowed or
    refused), refused ids, both forms at once, empty masks, biases; each row gets the reference
    token of its own mask and bias (None where its mask allows nothing). Layout "head": the logits
    are the transposed view of a row-major [vocab, rows] array, as the CPU vocabulary head returns
    them, which is argmaxed a block of vocabulary rows at a time (5,000: three blocks, with ties
    across them); without biases, which copy the batch row-major."""
    rng = random.Random(f"mixed-batch-{vocab}")
    rows, expected = [], []
    # Past one block: every other row's scores spread so wide that its maximum lies in any block,
    # the others' so narrow that maxima tie across blocks.
    spreads = (8, 8) if vocab < 1000 else (400, 40_000)
    for index in range(120):
        spread = spreads[index % 2]
        logits = [rng.randint(-spread, spread) / 4 for _ in range(vocab)]
        allowed = {t for t in range(vocab) if rng.random() < rng.choice((0.0, 0.02, 0.5, 0.98))}
        bias = {rng.randrange(vocab): rng.randint(-12, 12) / 4 for _ in range(rng.randint(0, 3))}
        if layout == "head":
            bias = {}    # a biased batch is copied row-major before the argmax
        form = rng.choice(("none", "ids", "bitmask", "refused", "both"))
        rows.append((logits, row_mask(allowed, form, vocab), bias_tensors(bias)))
        expected.append(reference_choice(logits, set(range(vocab)) if form == "none" else allowed,
                                         bias))
    batch = torch.tensor([logits for logits, _, _ in rows])
    if layout == "head":
        batch = batch.T.contiguous().T
        assert batch.stride() == (1, len(rows))
    chosen = greedy_rows(batch, [mask for _, mask, _ in rows], [bias for _, _, bias in rows])
    assert chosen == expected


def row_mask(allowed: set[int], form: str, vocab: int) -> tuple[Optional[torch.Tensor],
                                                                 Optional[torch.Tensor]]:
    """A row's (allowed ids, bitmask words) in `form`; refused ids decode as the worker does."""
    if form == "none":
        return None, None
    if form == "refused" and len(allowed) < vocab and allowed:
        refused = tuple(t for t in range(vocab) if t not in allowed)
        return decode_token_mask(TokenMask(refused_token_ids=refused), vocab)
    ids = torch.tensor(sorted(allowed), dtype=torch.int64)
    words = words_of(pack_bitmask(allowed, vocab, junk_past_vocab=True))
    return {"ids": (ids, None), "both": (ids, words)}.get(form, (None, words))


def bias_tensors(bias: dict[int, float]) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    if not bias:
        return None
    return (torch.tensor(list(bias), dtype=torch.int64),
            torch.tensor(list(bias.values()), dtype=torch.float32))
