"""DeepSeek-V4 mixture of experts: sqrt-softplus router, hash layers, clamped SwiGLU experts.

Routing (gate scores, `tid2eid` on hash layers) runs on the rank that holds the tokens, before any
exchange. Each token's routed outputs are added in ascending expert order, starting from zero, then
the shared expert: the single-rank path accumulates expert by expert, the expert-parallel path sums
the gathered per-slot outputs in the same order, so both give the same bits.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from services.worker.model import numerics
from services.worker.model.collectives import Collectives
from services.worker.model.config import ModelConfig
from services.worker.model.parallel import ParallelLayout
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


class MoeLayer:
    """One layer's MoE on this rank: all of its routed experts, or its EP share of them."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, hash_layer: bool,
                 layout: ParallelLayout, collectives: Collectives) -> None:
        self.config = config
        self.w = weights
        self.prefix = prefix                  # e.g. "layers.3.ffn."
        self.hash_layer = hash_layer
        self.local_experts = layout.experts(config)
        self.collectives = collectives
        self.limit = config.swiglu_limit if config.swiglu_limit > 0 else None

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """x [T, D] (ffn_norm output) → [T, D]."""
        weights, experts = route(x, token_ids, self.w, self.prefix, self.config, self.hash_layer)
        if self.collectives.expert_parallel:
            out = self._routed_exchanged(x, weights, experts)
        else:
            out = self._routed_local(x, weights, experts)
        # The shared expert has no SwiGLU clamp (official: "no swiglu_limit").
        out += _expert(x, self.w, self.prefix + "shared_experts.", None, None).float()
        return out.to(x.dtype)

    def _routed_local(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
                      ) -> torch.Tensor:
        """Every routed expert is here: accumulate in fp32, expert by expert in ascending order."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for expert_id in torch.unique(experts).tolist():
            rows, slot = torch.where(experts == expert_id)
            out.index_add_(0, rows, self._apply(expert_id, x[rows], weights[rows, slot]).float())
        return out

    def _routed_exchanged(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
                          ) -> torch.Tensor:
        """Send the tokens with their routing to the EP group, apply the local experts to every
        group's tokens, sum each (token, slot) output over the group, add the slots in ascending
        expert order."""
        dim, k = x.shape[1], experts.shape[1]
        packed = torch.cat([x.float(), weights, experts.float()], dim=1)
        gathered = self.collectives.gather_expert_inputs(packed)
        all_x = gathered[:, :dim].to(x.dtype)
        all_weights, all_experts = gathered[:, dim:dim + k], gathered[:, dim + k:].long()
        per_slot = torch.zeros(gathered.shape[0], k, dim, dtype=torch.float32, device=x.device)
        for expert_id in torch.unique(all_experts).tolist():
            if expert_id in self.local_experts:
                rows, slot = torch.where(all_experts == expert_id)
                per_slot[rows, slot] = self._apply(expert_id, all_x[rows],
                                                   all_weights[rows, slot]).float()
        mine = self.collectives.reduce_expert_outputs(per_slot)
        order = experts.argsort(dim=1)
        ordered = mine.gather(1, order.unsqueeze(-1).expand(-1, -1, dim))
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for slot in range(k):
            out += ordered[:, slot]
        return out

    def _apply(self, expert_id: int, x: torch.Tensor, route_weight: torch.Tensor) -> torch.Tensor:
        return _expert(x, self.w, f"{self.prefix}experts.{expert_id}.", self.limit,
                       route_weight[:, None])
