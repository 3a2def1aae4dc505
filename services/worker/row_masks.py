"""A row's token masks and speculative tokens as the worker checks them: masks decoded from the
step descriptor (allowed ids, XGrammar bitmask bytes or refused ids), drafts consistent with their
forced flags and with one mask per sampled position (verification.py)."""
from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import torch

from services.common.step_descriptors import RowMask, ScheduledRow, StepMasks, TokenMask
from services.worker.model.runtime import SequenceChunk, StepOutput
from services.worker.model.sampling import NO_ALLOWED_TOKEN, greedy_rows, select_rows
from services.worker.model.verification import PositionMask, sampled_offsets


# Distinct refused-id sets whose bitmask words are kept (16 KB each at V = 129,280).
REFUSED_MASKS_CACHED = 64


class RowError(Exception):
    """One row cannot run; the message goes back in that row's `RowResult.error`."""


def decode_token_mask(
    mask: TokenMask, vocab_size: int
) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Returns `(allowed_token_ids int64 [n], None)` or `(None, token_bitmask int32 [ceil(V/32)])`
    (refused ids become the bitmask of every other token).

    Raises `RowError` when more than one form is set, an id or the bitmask length does not fit the
    vocabulary, or the mask allows no token at all.
    """
    forms = [name for name in ("allowed_token_ids", "bitmask", "refused_token_ids")
             if getattr(mask, name)]
    if len(forms) > 1:
        raise RowError(f"token mask sets more than one form: {', '.join(forms)}")
    if mask.bitmask:
        return None, _decode_bitmask(mask.bitmask, vocab_size)
    if mask.refused_token_ids:
        return None, _refused_bitmask(mask.refused_token_ids, vocab_size)
    if not mask.allowed_token_ids:
        raise RowError("token mask allows no token")
    _check_ids(mask.allowed_token_ids, vocab_size, "allows")
    return torch.tensor(mask.allowed_token_ids, dtype=torch.int64), None


def _decode_bitmask(data: bytes, vocab_size: int) -> torch.Tensor:
    num_words = (vocab_size + 31) // 32
    if len(data) != 4 * num_words:
        raise RowError(f"token bitmask has {len(data)} bytes, expected {4 * num_words} "
                       f"(ceil({vocab_size}/32) int32 words)")
    words = np.frombuffer(data, dtype="<i4").astype(np.int32)
    # Bits past the vocabulary in the last word allow nothing real.
    tail_bits = vocab_size - 32 * (num_words - 1)
    last_word = int(words[-1]) & ((1 << tail_bits) - 1)
    if last_word == 0 and not words[:-1].any():
        raise RowError("token mask allows no token")
    return torch.from_numpy(words)


def _check_ids(token_ids: tuple[int, ...], vocab_size: int, verb: str) -> None:
    largest = max(token_ids)
    if largest >= vocab_size:
        raise RowError(f"token mask {verb} id {largest}, vocabulary has {vocab_size} tokens")


@functools.lru_cache(maxsize=REFUSED_MASKS_CACHED)
def _refused_bitmask(refused_token_ids: tuple[int, ...], vocab_size: int) -> torch.Tensor:
    """The int32 bitmask words allowing every token of the vocabulary but `refused_token_ids`
    (read only: shared by every row refusing the same ids). Free-text rows of one grammar refuse
    the same few ids, so a batch builds each set once: a batch-32 step's masks decode in ~0.015 ms
    from the cache against ~0.2 ms built row by row (~6.5 µs each, bench/bench_mask_path.py)."""
    _check_ids(refused_token_ids, vocab_size, "refuses")
    num_words = (vocab_size + 31) // 32
    words = np.full(num_words, 0xFFFFFFFF, dtype=np.uint32)
    words[-1] >>= 32 * num_words - vocab_size   # no bit past the vocabulary
    ids = np.asarray(refused_token_ids, dtype=np.uint32)
    np.bitwise_and.at(words, ids >> 5, ~(np.uint32(1) << (ids & 31)))
    if len(refused_token_ids) >= vocab_size and not words.any():
        raise RowError("token mask allows no token")
    return torch.from_numpy(words.view(np.int32))


def check_drafts(row: ScheduledRow) -> None:
    """A row's drafts fit its flags and masks (RowError otherwise)."""
    drafts = row.draft_token_ids
    if drafts and not row.sample:
        raise RowError(f"row of sequence {row.seq_id} has drafts but does not sample")
    if row.draft_forced and len(row.draft_forced) != len(drafts):
        raise RowError(f"row of sequence {row.seq_id}: {len(row.draft_forced)} forced flags "
                       f"for {len(drafts)} drafts")
    if row.draft_forced and row.draft_forced[0]:
        raise RowError(f"row of sequence {row.seq_id}: the first draft cannot be forced")
    forced = list(row.draft_forced) or [False] * len(drafts)
    sampled_after_first = len(sampled_offsets(len(drafts), forced)) - 1
    if row.mask is not None and len(row.draft_masks) != sampled_after_first:
        raise RowError(f"row of sequence {row.seq_id}: {len(row.draft_masks)} draft masks for "
                       f"{sampled_after_first} sampled draft positions")


def sample_late_rows(chunks: list[SequenceChunk], output: StepOutput, masks: StepMasks,
                     late_seq_ids: set[int], vocab_size: int) -> None:
    """Sample the chunks of `late_seq_ids` (they did not sample in the runtime; `output` has
    their last position's logits) under the masks that followed, in one batch."""
    late = masks.by_seq()
    output.errors = output.errors or [None] * len(chunks)
    picked, position_masks = [], []
    for i, chunk in enumerate(chunks):
        if chunk.seq_id in late_seq_ids:
            try:
                position_masks.append(_late_position_mask(chunk, late.get(chunk.seq_id),
                                                          vocab_size))
                picked.append(i)
            except RowError as error:
                output.sampled[i], output.errors[i] = None, str(error)
    if not picked:
        return
    scores = select_rows(output.logits_batch, [output.logits_row[i] for i in picked])
    tokens = greedy_rows(scores, position_masks, [chunks[i].logit_bias for i in picked])
    for i, token in zip(picked, tokens):
        output.sampled[i] = token
        if token is None:
            output.errors[i] = NO_ALLOWED_TOKEN


def _late_position_mask(chunk: SequenceChunk, late: Optional[RowMask],
                        vocab_size: int) -> PositionMask:
    """The mask a `mask_follows` row samples under once it came (a discarded row samples
    unmasked: its answer is ignored); RowError when none came or it does not decode."""
    if late is None:
        raise RowError(f"no mask followed for sequence {chunk.seq_id}")
    if late.discard or late.mask is None:
        return None, None
    return decode_token_mask(late.mask, vocab_size)
