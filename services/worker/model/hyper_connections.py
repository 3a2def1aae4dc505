"""Manifold-constrained hyper-connections (mHC): hc residual copies mixed around every sublayer.

All of it runs in fp32. The Sinkhorn normalisation follows the official kernel's order of
operations: row softmax + eps, a column normalisation, then (iters - 1) rounds of (row, column)
normalisation, each dividing by (sum + eps).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.model import numerics


@dataclass(frozen=True)
class HcParams:
    fn: torch.Tensor      # fp32 [(2 + hc) * hc, hc * D] (block) or [hc, hc * D] (head)
    base: torch.Tensor    # fp32 [(2 + hc) * hc] or [hc]
    scale: torch.Tensor   # fp32 [3] or [1]


def _mixes(x: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    flat = x.flatten(1).float()
    rsqrt = torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    return numerics.linear(flat, fn) * rsqrt


def sinkhorn_split(mixes: torch.Tensor, p: HcParams, hc: int, iters: int, eps: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixes [T, (2+hc)·hc] → pre [T, hc], post [T, hc], comb [T, hc(j, source), hc(k, target)]."""
    pre = torch.sigmoid(mixes[:, :hc] * p.scale[0] + p.base[:hc]) + eps
    post = 2 * torch.sigmoid(mixes[:, hc:2 * hc] * p.scale[1] + p.base[hc:2 * hc])
    comb = (mixes[:, 2 * hc:] * p.scale[2] + p.base[2 * hc:]).view(-1, hc, hc)
    comb = comb.softmax(dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


def hc_pre(x: torch.Tensor, p: HcParams, iters: int, hc_eps: float, norm_eps: float
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, hc, D] → sublayer input y [T, D] (x's dtype), post [T, hc], comb [T, hc, hc]."""
    hc = x.shape[1]
    pre, post, comb = sinkhorn_split(_mixes(x, p.fn, norm_eps), p, hc, iters, hc_eps)
    y = (pre.unsqueeze(-1) * x.float()).sum(dim=1)
    return y.to(x.dtype), post, comb


def hc_post(out: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
            ) -> torch.Tensor:
    """New copies x'_k = post_k · out + Σ_j comb[j, k] · x_j, in out's dtype."""
    mixed = (comb.unsqueeze(-1) * residual.unsqueeze(-2)).sum(dim=1)
    return (post.unsqueeze(-1) * out.unsqueeze(-2) + mixed).to(out.dtype)


def hc_head(x: torch.Tensor, p: HcParams, hc_eps: float, norm_eps: float) -> torch.Tensor:
    """Collapse the hc copies for the output head: y = Σ_j (sigmoid(·) + eps)_j x_j."""
    pre = torch.sigmoid(_mixes(x, p.fn, norm_eps) * p.scale + p.base) + hc_eps
    return (pre.unsqueeze(-1) * x.float()).sum(dim=1).to(x.dtype)
