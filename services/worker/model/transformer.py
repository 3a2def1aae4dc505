"""The DeepSeek-V4 forward pass: embed → blocks (mHC around attention and MoE) → hc head → logits.

The MTP block (`mtp_forward`) reuses the same block code with its own caches; the DSpark draft
stages (dspark_draft.py) reuse it around their own attention (`block_with`).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from services.worker.model import hyper_connections as mhc
from services.worker.model import numerics
from services.worker.model.attention import AttentionLayer
from services.worker.model.batch import StepBatch
from services.worker.model.collectives import Collectives, LocalCollectives
from services.worker.model.config import ModelConfig
from services.worker.model.kv_cache import PagedKvCache
from services.worker.model.moe import MoeLayer
from services.worker.model.parallel import ParallelLayout
from services.worker.model.weights import ModelWeights


class DeepseekV4:
    """The model as one rank holds it (`layout`; the single-rank default holds everything)."""

    def __init__(self, config: ModelConfig, weights: ModelWeights,
                 layout: ParallelLayout = ParallelLayout(),
                 collectives: Collectives = LocalCollectives()):
        self.config = config
        self.w = weights
        self.collectives = collectives
        self.attention = {
            layer_id: AttentionLayer(config, weights, layer_id,
                                     self.block_prefix(layer_id) + "attn.", layout, collectives)
            for layer_id in range(config.num_layers_total)}
        self.moe = {layer_id: MoeLayer(config, weights, self.block_prefix(layer_id) + "ffn.",
                                       config.is_hash_layer(layer_id), layout, collectives)
                    for layer_id in range(config.num_layers_total)}

    def block_prefix(self, layer_id: int) -> str:
        """Main layers live under `layers.i.`, MTP blocks under `mtp.m.` (layer ids continue)."""
        n = self.config.num_hidden_layers
        return f"layers.{layer_id}." if layer_id < n else f"mtp.{layer_id - n}."

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """ids [T] → [T, D] in the compute dtype."""
        return self.w["embed.weight"][token_ids]

    def block(self, layer_id: int, h: torch.Tensor, batch: StepBatch, cache: PagedKvCache
              ) -> torch.Tensor:
        """h [T, hc, D] → [T, hc, D]."""
        return self.block_with(layer_id, h, batch.token_ids,
                               lambda y: self.attention[layer_id].forward(y, batch, cache))

    def block_with(self, layer_id: int, h: torch.Tensor, token_ids: torch.Tensor,
                   attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """One block around a given attention (attn_norm output [T, D] → [T, D]): the paged
        attention of the main and MTP layers, the DSpark stages' window-plus-block attention."""
        cfg, w = self.config, self.w
        prefix = self.block_prefix(layer_id)
        iters, hc_eps, eps = cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps
        y, post, comb = mhc.hc_pre(h, w.hc(prefix, "attn"), iters, hc_eps, eps)
        y = numerics.rms_norm(y, w[prefix + "attn_norm.weight"], eps)
        h = mhc.hc_post(attend(y), h, post, comb)
        y, post, comb = mhc.hc_pre(h, w.hc(prefix, "ffn"), iters, hc_eps, eps)
        y = numerics.rms_norm(y, w[prefix + "ffn_norm.weight"], eps)
        ffn = self.moe[layer_id].forward(y, token_ids)
        return mhc.hc_post(ffn, h, post, comb)

    def forward_hidden(self, batch: StepBatch, cache: PagedKvCache,
                       tap_layer_ids: tuple[int, ...] = ()
                       ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """All main layers → (the last layer's hc streams [T, hc, D], taps). Every rank of an EP
        group runs it every step, with zero rows when its partition has none (see
        collectives.py).

        taps: the outputs of `tap_layer_ids` (in that order) averaged over the hc copies,
        [T, len(tap_layer_ids), D] — what a DSpark draft reads; None when no layer is tapped.
        """
        self._check_taps(tap_layer_ids)
        self.collectives.begin_step(batch.token_ids.shape[0])
        h = self.embed(batch.token_ids).unsqueeze(1).repeat(1, self.config.hc_mult, 1)
        tapped: dict[int, torch.Tensor] = {}
        for layer_id in range(self.config.num_hidden_layers):
            h = self.block(layer_id, h, batch, cache)
            if layer_id in tap_layer_ids:
                tapped[layer_id] = h.float().mean(dim=1).to(h.dtype)
        if not tap_layer_ids:
            return h, None
        return h, torch.stack([tapped[i] for i in tap_layer_ids], dim=1)

    def _check_taps(self, tap_layer_ids: tuple[int, ...]) -> None:
        n = self.config.num_hidden_layers
        if any(not 0 <= i < n for i in tap_layer_ids):
            raise ValueError(f"tap layer ids {list(tap_layer_ids)} must lie in [0, {n})")

    def collapse(self, h: torch.Tensor, prefix: str = "") -> torch.Tensor:
        """hc streams [n, hc, D] → the head's input [n, D] before its norm (`hc_head`)."""
        cfg = self.config
        return mhc.hc_head(h, self.w.hc(prefix, "head"), cfg.hc_eps, cfg.rms_norm_eps)

    def head_logits(self, y: torch.Tensor, prefix: str = "") -> torch.Tensor:
        """Collapsed streams [n, D] → fp32 logits [n, V]: `{prefix}norm`, then the shared head."""
        y = numerics.rms_norm(y, self.w[prefix + "norm.weight"], self.config.rms_norm_eps)
        return numerics.wide_linear(y.float(), self.w["head.weight"])

    def logits(self, h: torch.Tensor, prefix: str = "") -> torch.Tensor:
        """hc streams [n, hc, D] → fp32 logits [n, V] (prefix "mtp.m." for an MTP head)."""
        return self.head_logits(self.collapse(h, prefix), prefix)

    def mtp_forward(self, h: torch.Tensor, next_ids: torch.Tensor, batch: StepBatch,
                    cache: PagedKvCache, mtp_index: int = 0) -> torch.Tensor:
        """MTP block on the main model's last-layer streams h [T, hc, D] and the ids of the
        following tokens `next_ids` [T] → its own last-layer streams [T, hc, D].

        `batch` carries the positions and block tables (its token ids must be `next_ids`);
        `cache` must serve the MTP layer id (num_hidden_layers + mtp_index).
        """
        cfg, w = self.config, self.w
        self.collectives.begin_step(next_ids.shape[0])
        prefix = f"mtp.{mtp_index}."
        e = numerics.rms_norm(self.embed(next_ids), w[prefix + "enorm.weight"], cfg.rms_norm_eps)
        x = numerics.rms_norm(h, w[prefix + "hnorm.weight"], cfg.rms_norm_eps)
        x = numerics.linear(e, w[prefix + "e_proj.weight"]).unsqueeze(1) + numerics.linear(
            x, w[prefix + "h_proj.weight"])
        return self.block(cfg.num_hidden_layers + mtp_index, x, batch, cache)
