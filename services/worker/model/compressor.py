"""KV compressor: gated pooling of every `ratio` tokens into one compressed entry.

A compressor keeps no recurrent state: the projected rows of every token are stored in the paged
`csa_state` / `hca_state` block groups (kv_cache.py), and pooling an entry reads its rows back from
there. Chunked prefill, one-shot prefill, token-by-token decode and a resume from a cached prefix
therefore pool exactly the same rows in the same order.

With overlap the projections are 2c wide: entry j pools block j−1 through channels [:c] and block j
through channels [c:2c] (a missing block −1 contributes kv 0 and score −inf).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.model import numerics
from services.worker.model.weights import ModelWeights


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


def pool(spec: CompressorSpec, kv: torch.Tensor, score: torch.Tensor, count: int
         ) -> torch.Tensor:
    """Pool `count` consecutive entries from their rows → raw entries [count, c] (not yet
    normalised; `finish` does that).

    kv, score: fp32 rows of the entries' tokens, `count · ratio` of them, preceded with overlap by
    the `ratio` rows of the block before the first entry (kv 0, score −inf before position 0).
    """
    m, c = spec.ratio, spec.head_dim
    width = kv.shape[1]
    blocks = count + 1 if spec.overlap else count
    blocks_kv = kv.view(blocks, m, width)
    blocks_score = score.view(blocks, m, width)
    if spec.overlap:
        win_kv = torch.cat([blocks_kv[:-1, :, :c], blocks_kv[1:, :, c:]], dim=1)
        win_score = torch.cat([blocks_score[:-1, :, :c], blocks_score[1:, :, c:]], dim=1)
    else:
        win_kv, win_score = blocks_kv, blocks_score
    return (win_kv * win_score.softmax(dim=1)).sum(dim=1)


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
