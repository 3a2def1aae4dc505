"""DeepSeek-V4 mixture of experts: sqrt-softplus router, hash layers, clamped SwiGLU experts."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from services.worker.model import numerics
from services.worker.model.config import ModelConfig
from services.worker.model.weights import ModelWeights


def route(x: torch.Tensor, token_ids: torch.Tensor, w: ModelWeights, prefix: str,
          config: ModelConfig, hash_layer: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (weights fp32 [T, k], expert ids [T, k]).

    The gate bias only changes which experts are selected; the weights always come from the
    unbiased scores, normalised to sum 1 and scaled by routed_scaling_factor.
    """
    scores = F.softplus(numerics.linear(x.float(), w[prefix + "gate.weight"])).sqrt()
    if hash_layer:
        experts = w[prefix + "gate.tid2eid"][token_ids]
    else:
        biased = scores + w[prefix + "gate.bias"]
        experts = biased.topk(config.num_experts_per_tok, dim=-1).indices
    weights = scores.gather(1, experts)
    weights = weights / weights.sum(dim=-1, keepdim=True) * config.routed_scaling_factor
    return weights, experts


def _expert(x: torch.Tensor, w: ModelWeights, prefix: str, limit: float | None,
            route_weight: torch.Tensor | None) -> torch.Tensor:
    gate = numerics.linear(x, w[prefix + "w1.weight"]).float()
    up = numerics.linear(x, w[prefix + "w3.weight"]).float()
    if limit is not None:
        up = up.clamp(-limit, limit)
        gate = gate.clamp(max=limit)
    hidden = F.silu(gate) * up
    if route_weight is not None:
        hidden = route_weight * hidden
    return numerics.linear(hidden.to(x.dtype), w[prefix + "w2.weight"])


def moe_forward(x: torch.Tensor, token_ids: torch.Tensor, w: ModelWeights, prefix: str,
                config: ModelConfig, hash_layer: bool) -> torch.Tensor:
    """x [T, D] (ffn_norm output) → [T, D]; routed experts accumulate in fp32 in expert order."""
    weights, experts = route(x, token_ids, w, prefix, config, hash_layer)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    limit = config.swiglu_limit if config.swiglu_limit > 0 else None
    for expert_id in torch.unique(experts).tolist():
        rows, slot = torch.where(experts == expert_id)
        y = _expert(x[rows], w, f"{prefix}experts.{expert_id}.", limit, weights[rows, slot, None])
        out.index_add_(0, rows, y.float())
    # The shared expert has no SwiGLU clamp (official: "no swiglu_limit").
    out += _expert(x, w, prefix + "shared_experts.", None, None).float()
    return out.to(x.dtype)
