"""Greedy sampling: logit bias is added before the grammar mask; both mask layouts select the
same tokens; a row whose mask allows nothing fails alone (in a batch: the others are sampled)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
import torch

from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
from services.worker.model.sampling import greedy_rows, unpack_bitmask

VOCAB = 100


def bitmask_of(allowed: list[int], vocab: int = VOCAB) -> torch.Tensor:
    """XGrammar layout: bit i of int32 word w allows token 32·w + i."""
    words = [0] * ((vocab + 31) // 32)
    for token in allowed:
        words[token // 32] |= 1 << (token % 32)
    # Two's complement: bit 31 set makes the int32 word negative.
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


def greedy_sample(logits: torch.Tensor, allowed_token_ids: Optional[torch.Tensor] = None,
                  token_bitmask: Optional[torch.Tensor] = None,
                  logit_bias: Optional[tuple[torch.Tensor, torch.Tensor]] = None
                  ) -> Optional[int]:
    """One row sampled as a batch of one."""
    return greedy_rows(logits.unsqueeze(0), [(allowed_token_ids, token_bitmask)],
                       [logit_bias])[0]


@pytest.fixture()
def logits() -> torch.Tensor:
    values = torch.linspace(-1.0, 1.0, VOCAB)
    values[42] = 5.0          # the unconstrained winner
    values[7] = 4.0
    values[63] = 3.0          # bit 31 of word 1
    return values


def test_unconstrained_row_takes_the_argmax(logits: torch.Tensor) -> None:
    assert greedy_sample(logits) == 42


def test_logit_bias_moves_the_argmax(logits: torch.Tensor) -> None:
    bias = (torch.tensor([42, 7]), torch.tensor([-10.0, 0.5]))
    assert greedy_sample(logits, logit_bias=bias) == 7


def test_allowed_ids_restrict_the_choice(logits: torch.Tensor) -> None:
    assert greedy_sample(logits, allowed_token_ids=torch.tensor([3, 7, 63])) == 7


def test_bitmask_layout_matches_the_id_list(logits: torch.Tensor) -> None:
    for allowed in ([63], [7, 63], [0, 31, 32, 99], [98, 99]):
        by_ids = greedy_sample(logits, allowed_token_ids=torch.tensor(allowed))
        by_bits = greedy_sample(logits, token_bitmask=bitmask_of(allowed))
        assert by_bits == by_ids
        assert by_bits in allowed
    unpacked = unpack_bitmask(bitmask_of([0, 31, 63, 99]), VOCAB)
    assert torch.nonzero(unpacked).flatten().tolist() == [0, 31, 63, 99]


def test_bitmask_picks_the_lowest_allowed_id_among_tied_maxima(logits: torch.Tensor) -> None:
    logits[50] = logits[42] = logits[60] = 6.0
    assert greedy_sample(logits, token_bitmask=bitmask_of(list(range(VOCAB)))) == 42
    assert greedy_sample(logits, token_bitmask=bitmask_of([60, 50, 7])) == 50


def test_bias_cannot_reenable_a_masked_token(logits: torch.Tensor) -> None:
    bias = (torch.tensor([42]), torch.tensor([100.0]))
    assert greedy_sample(logits, allowed_token_ids=torch.tensor([7, 63]), logit_bias=bias) == 7
    bias = (torch.tensor([63]), torch.tensor([2.0]))
    assert greedy_sample(logits, token_bitmask=bitmask_of([7, 63]), logit_bias=bias) == 63


def test_mask_that_allows_nothing_fails_only_its_row_of_the_batch(logits: torch.Tensor) -> None:
    batch = torch.stack([logits] * 4)
    masks = [(None, bitmask_of([])), (None, bitmask_of([7])),
             (torch.tensor([], dtype=torch.int64), None), (torch.tensor([63]), None)]
    assert greedy_rows(batch, masks, [None] * 4) == [None, 7, None, 63]


def test_empty_mask_fails_only_its_own_row(tiny_model_dir: Path) -> None:
    runtime = ModelRuntime(RuntimeConfig(model_dir=tiny_model_dir, dtype=torch.float32,
                                         device="cpu", block_size=16, num_blocks=8))
    vocab = runtime.config.vocab_size
    empty = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
    def tables(block: int) -> dict[str, list[int]]:
        return runtime.cache.same_table_for_every_group([block])

    free = runtime.step([SequenceChunk(1, 0, [0, 5, 9], tables(0), sample=True)],
                        return_logits=True)
    target = int(free.logits[0].topk(2).indices[1])    # the runner-up, forced by the mask
    out = runtime.step([
        SequenceChunk(1, 0, [0, 5, 9], tables(0), sample=True,
                      allowed_token_ids=torch.tensor([target])),
        SequenceChunk(2, 0, [0, 5, 9], tables(1), sample=True, token_bitmask=empty),
        SequenceChunk(3, 0, [0, 5, 9], tables(2), sample=True)])
    assert out.sampled == [target, None, free.sampled[0]]
    assert out.errors[0] is None and out.errors[2] is None
    assert out.errors[1] is not None
