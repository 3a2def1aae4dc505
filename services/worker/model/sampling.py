"""Greedy sampling of a step's rows in one batch: an optional additive logit bias per row, then an
optional grammar mask per row.

The bias is added before masking, so a bias can never re-enable a token the grammar forbids.
Masks come in two layouts: a list of allowed token ids, or an XGrammar bitmask of int32 words where
bit i of word w allows token 32·w + i (both given: their intersection). A row whose mask allows
nothing gets None; the caller reports it for that row only.

One argmax over the whole batch serves every row; a bitmasked row keeps it when its bit is set
(free text almost always: the mask is wide), and only the rows whose winner was refused are
unpacked and masked, together. Rows listing their allowed ids (a few structural tokens) gather
those scores instead of building a vocabulary-wide mask. At batch 32 this takes ~5 ms where one
greedy call per row took ~10 ms (bench/bench_mask_path.py).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from services.worker.model.verification import PositionMask

NO_ALLOWED_TOKEN = "the grammar mask allows no token"
LogitBias = tuple[torch.Tensor, torch.Tensor]   # (ids int64, values float32)
_ARGMAX_BLOCK_ROWS = 2048   # [2048, 32] fp32 = 256 KiB: within L2 (1024–4096 measured alike)


class NoAllowedToken(ValueError):
    """The grammar mask of a sampled position allows no token of the vocabulary."""


def greedy_rows(logits: torch.Tensor, masks: Sequence[PositionMask],
                biases: Sequence[Optional[LogitBias]]) -> list[Optional[int]]:
    """logits [N, V] → per row the argmax token id (lowest id on ties) under its bias and mask;
    None for a row whose mask allows no token."""
    scores = _biased(logits, biases)
    # Rows listing their ids need no argmax of the whole vocabulary; the others share one.
    best = _argmax(scores) if any(ids is None for ids, _ in masks) else None
    tokens: list[Optional[int]] = best.tolist() if best is not None else [None] * len(masks)
    listed = [i for i, (ids, _) in enumerate(masks) if ids is not None]
    for i, token in zip(listed, _best_listed(scores, listed, [masks[i] for i in listed])):
        tokens[i] = token
    bitmasked = [i for i, (ids, words) in enumerate(masks) if ids is None and words is not None]
    for i, token in _refused_winners(scores, best, bitmasked, [masks[i][1] for i in bitmasked]):
        tokens[i] = token
    return tokens


def select_rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The `rows` of a logits batch, in order, keeping the CPU head's transposed layout (see
    `_argmax_of_columns`): a row-major stack of its strided rows took ~25 ms at [32, 129,280],
    selecting columns of the storage ~4.5 ms, and all the rows cost nothing."""
    if rows == list(range(logits.shape[0])):
        return logits
    index = torch.tensor(rows, device=logits.device)
    if _in_head_layout(logits):
        return logits.T.index_select(1, index).T
    return logits.index_select(0, index)


def _refused_winners(scores: torch.Tensor, best: Optional[torch.Tensor], rows: list[int],
                     words: list[torch.Tensor]) -> list[tuple[int, Optional[int]]]:
    """(row, its masked argmax) for each of the bitmasked `rows` whose bitmask refuses its
    winner `best[row]`: those rows alone are unpacked and masked, together."""
    if not rows:
        return []
    stacked = torch.stack(words).to(scores.device)
    refused = _refused(stacked, best[rows]).nonzero().flatten().tolist()
    if not refused:
        return []
    chosen = _masked_argmax(_rows(scores, [rows[k] for k in refused]), stacked[refused])
    return [(rows[k], token) for k, token in zip(refused, chosen)]


def _argmax(scores: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax (the lowest index among maxima; a NaN counts as the maximum). On the CPU
    numpy's: [32, 129,280] fp32 in ~0.75 ms against ~11 ms for torch's, one thread."""
    if scores.device.type != "cpu":
        return scores.argmax(dim=-1)
    if _in_head_layout(scores):
        return torch.from_numpy(_argmax_of_columns(scores.T.numpy()))
    return torch.from_numpy(np.argmax(scores.numpy(), axis=-1))


def _in_head_layout(logits: torch.Tensor) -> bool:
    """[N, V] logits that are the transposed view of a row-major [V, N] array, as the CPU head
    returns them (see `_argmax_of_columns`)."""
    return logits.stride(-1) != 1 and logits.stride(0) == 1


def _argmax_of_columns(columns: np.ndarray) -> np.ndarray:
    """Per column of a row-major [V, N] array, the argmax (same rule as `_argmax`), a cache-sized
    block of rows at a time. The CPU vocabulary head computes weight @ x.T (see
    numerics.wide_linear), so a step's logits arrive as the transposed view of such an array:
    numpy's argmax along the strided axis took 18.5 ms at [32, 129,280], a contiguous copy first
    9 ms, blocks of 2,048 rows 3.6 ms (one thread)."""
    vocab_size, num_rows = columns.shape
    every_row = np.arange(num_rows)
    block_argmax, block_max = [], []
    for start in range(0, vocab_size, _ARGMAX_BLOCK_ROWS):
        block = np.ascontiguousarray(columns[start:start + _ARGMAX_BLOCK_ROWS].T)
        best = block.argmax(axis=-1)
        block_argmax.append(best + start)
        block_max.append(block[every_row, best])
    # The first block holding a row's maximum (or its first NaN) holds its lowest such index.
    first_best_block = np.argmax(np.stack(block_max), axis=0)
    return np.stack(block_argmax)[first_best_block, every_row]


def _rows(scores: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """A copy of `rows` of the batch (numpy's row copy on the CPU: ~5× torch's there)."""
    if scores.device.type == "cpu":
        return torch.from_numpy(scores.numpy()[rows])
    return scores[rows]


def _biased(logits: torch.Tensor, biases: Sequence[Optional[LogitBias]]) -> torch.Tensor:
    """fp32 scores with every row's bias added (one index_add over the flattened batch)."""
    rows = [(i, bias) for i, bias in enumerate(biases) if bias is not None]
    if not rows:
        return logits.float()
    scores = logits.float().clone(memory_format=torch.contiguous_format)
    vocab_size = scores.shape[-1]
    flat_ids = torch.cat([ids.to(torch.int64) + i * vocab_size for i, (ids, _) in rows])
    values = torch.cat([values.to(torch.float32) for _, (_, values) in rows])
    scores.view(-1).index_add_(0, flat_ids.to(scores.device), values.to(scores.device))
    return scores


def _refused(words: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """bool [m]: row r's bitmask `words[r]` refuses `tokens[r]`."""
    word = words.gather(1, (tokens >> 5).unsqueeze(1)).squeeze(1).to(torch.int64)
    return ((word >> (tokens & 31)) & 1) == 0


def _masked_argmax(scores: torch.Tensor, words: torch.Tensor) -> list[Optional[int]]:
    """The argmax of each row among the tokens its bitmask allows (None: it allows none). On the
    CPU in numpy, whose where and argmax take a fraction of torch's (np.where over [32, 129,280]
    ~4 ms against ~16 ms for masked_fill, one thread)."""
    allowed = unpack_bitmask(words, scores.shape[-1])
    if scores.device.type == "cpu":
        masked = np.where(allowed.numpy(), scores.numpy(), np.float32(-np.inf))
        best, any_allowed = np.argmax(masked, axis=-1), allowed.numpy().any(axis=-1)
    else:
        best = torch.where(allowed, scores, float("-inf")).argmax(dim=-1)
        any_allowed = allowed.any(dim=-1)
    return [token if ok else None for token, ok in zip(best.tolist(), any_allowed.tolist())]


def _best_listed(scores: torch.Tensor, rows: list[int],
                 masks: list[PositionMask]) -> list[Optional[int]]:
    """For each of `rows`, the lowest id among the best-scoring ids its mask lists (inside the
    vocabulary, and allowed by its bitmask when it has both forms), gathered without a [V] mask
    (4 listed ids: ~0.01 ms against ~0.8 ms for a vocabulary-wide mask), all rows at once."""
    if not rows:
        return []
    vocab_size, device = scores.shape[-1], scores.device
    padded = pad_sequence([ids.to(device=device, dtype=torch.int64) for ids, _ in masks],
                          batch_first=True, padding_value=-1)
    if padded.shape[1] == 0:
        return [None] * len(rows)
    valid = (padded >= 0) & (padded < vocab_size)
    padded = padded.clamp(0, vocab_size - 1)
    for k, (_, words) in enumerate(masks):
        if words is not None:
            valid[k] &= ~_refused(words.to(device).expand(padded.shape[1], -1), padded[k])
    listed = torch.where(valid, scores[torch.tensor(rows, device=device).unsqueeze(1), padded],
                         float("-inf"))
    top = listed.max(dim=1, keepdim=True).values
    lowest = torch.where(valid & (listed == top), padded, vocab_size).min(dim=1).values
    # NaN scores tie with nothing: then the first NaN, as argmax takes it.
    first_nan = padded.gather(1, listed.argmax(dim=1, keepdim=True)).squeeze(1)
    chosen = torch.where(lowest < vocab_size, lowest, first_nan).tolist()
    return [token if ok else None for token, ok in zip(chosen, valid.any(dim=1).tolist())]


def unpack_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [..., ceil(V/32)] → bool [..., V]; bits past the vocabulary are ignored.

    On the CPU numpy unpacks the bytes: 129,280 bits in ~0.05 ms against ~1.3 ms for the shifts
    (bench/bench_mask_path.py)."""
    if words.device.type == "cpu":
        data = words.to(torch.int32).contiguous().numpy().astype("<i4", copy=False).view(np.uint8)
        allowed = torch.from_numpy(np.unpackbits(data, axis=-1, bitorder="little").view(np.bool_))
    else:
        shifts = torch.arange(32, dtype=torch.int32, device=words.device)
        allowed = ((words.to(torch.int32).unsqueeze(-1) >> shifts) & 1).flatten(-2).bool()
    missing = vocab_size - allowed.shape[-1]
    if missing > 0:
        allowed = torch.cat([allowed, allowed.new_zeros(*allowed.shape[:-1], missing)], dim=-1)
    return allowed[..., :vocab_size]
