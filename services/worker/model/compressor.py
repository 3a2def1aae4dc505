"""KV compressor: gated pooling of every `ratio` tokens into one compressed entry.

Per sequence, a compressor keeps a recurrent state (`CompressorState`): the projected rows of the
block in progress and, with overlap (ratio 4), the rows of the last complete block. A chunk of any
length continues from that state, so chunked prefill, one-shot prefill and token-by-token decode
pool exactly the same rows in the same order.

With overlap the projections are 2c wide: entry j pools block j−1 through channels [:c] and block j
through channels [c:2c] (a missing block −1 contributes kv 0 and score −inf).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from services.worker.model import numerics
from services.worker.model.weights import ModelWeights


@dataclass
class CompressorState:
    pending_kv: torch.Tensor           # fp32 [p, width]: rows of the block in progress (p < ratio)
    pending_score: torch.Tensor        # fp32 [p, width]: gate scores with the position bias added
    prev_kv: Optional[torch.Tensor]    # fp32 [ratio, width]: last complete block (overlap only)
    prev_score: Optional[torch.Tensor]

    @classmethod
    def empty(cls, width: int, device: str) -> "CompressorState":
        rows = torch.empty(0, width, dtype=torch.float32, device=device)
        return cls(rows, rows.clone(), None, None)


@dataclass(frozen=True)
class CompressorSpec:
    prefix: str          # e.g. "layers.1.attn.compressor." or "layers.1.attn.indexer.compressor."
    ratio: int
    head_dim: int        # c: width of one entry
    rope_dim: int
    rotate: bool         # indexer keys: Hadamard + FP4 instead of the FP8 round trip

    @property
    def overlap(self) -> bool:
        return self.ratio == 4


def project(spec: CompressorSpec, w: ModelWeights, x: torch.Tensor, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] → fp32 kv [T, width], score [T, width] (position bias `ape[pos % ratio]` added)."""
    xf = x.float()
    kv = numerics.linear(xf, w[spec.prefix + "wkv.weight"])
    score = numerics.linear(xf, w[spec.prefix + "wgate.weight"])
    score = score + w[spec.prefix + "ape"][positions % spec.ratio]
    return kv, score


def pool(spec: CompressorSpec, state: CompressorState, kv: torch.Tensor, score: torch.Tensor,
         start_pos: int) -> tuple[int, torch.Tensor, CompressorState]:
    """Feed one chunk's rows (positions start_pos..) → (first entry index, raw entries, state).

    The entries are not yet normalised; `finish` does that.
    """
    m, c = spec.ratio, spec.head_dim
    rows_kv = torch.cat([state.pending_kv, kv])
    rows_score = torch.cat([state.pending_score, score])
    base_pos = start_pos - state.pending_kv.shape[0]
    n_blocks = rows_kv.shape[0] // m
    cut = n_blocks * m
    width = rows_kv.shape[1]
    blocks_kv = rows_kv[:cut].view(n_blocks, m, width)
    blocks_score = rows_score[:cut].view(n_blocks, m, width)
    if spec.overlap and n_blocks:
        if state.prev_kv is None:
            first_kv = torch.zeros_like(blocks_kv[:1])
            first_score = torch.full_like(blocks_score[:1], float("-inf"))
        else:
            first_kv, first_score = state.prev_kv[None], state.prev_score[None]
        prev_kv = torch.cat([first_kv, blocks_kv[:-1]])
        prev_score = torch.cat([first_score, blocks_score[:-1]])
        win_kv = torch.cat([prev_kv[..., :c], blocks_kv[..., c:]], dim=1)
        win_score = torch.cat([prev_score[..., :c], blocks_score[..., c:]], dim=1)
    else:
        win_kv, win_score = blocks_kv, blocks_score
    entries = (win_kv * win_score.softmax(dim=1)).sum(dim=1)
    new_state = CompressorState(
        pending_kv=rows_kv[cut:].clone(), pending_score=rows_score[cut:].clone(),
        prev_kv=blocks_kv[-1].clone() if spec.overlap and n_blocks else state.prev_kv,
        prev_score=blocks_score[-1].clone() if spec.overlap and n_blocks else state.prev_score)
    return base_pos // m, entries, new_state


def finish(spec: CompressorSpec, w: ModelWeights, entries: torch.Tensor, first_entry: int,
           inv_freq: torch.Tensor, dtype: torch.dtype, eps: float) -> torch.Tensor:
    """RMSNorm, RoPE at each entry's first token, then the QAT round trip → [n, c] in dtype."""
    out = numerics.rms_norm(entries.to(dtype), w[spec.prefix + "norm.weight"], eps)
    index = torch.arange(entries.shape[0], device=entries.device) + first_entry
    first_tokens = index * spec.ratio
    out = numerics.apply_rope(out, numerics.rope_table(inv_freq, first_tokens), spec.rope_dim)
    if spec.rotate:
        return numerics.fp4_round_trip(numerics.hadamard_rotate(out), 32)
    nope = numerics.fp8_round_trip(out[:, :-spec.rope_dim], 64)
    return torch.cat([nope, out[:, -spec.rope_dim:]], dim=-1)
