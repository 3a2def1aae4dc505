"""The DSpark draft network's math, stateless: context KV, the stages over draft blocks, the heads.

Sources: SGLang `models/deepseek_v4_dspark.py` + `speculative/dspark_components` (and vLLM's DSpark
proposer); scale-out.md §4. One stage per `dspark_target_layer_ids` entry, stored as the blocks
`mtp.0 .. mtp.{S-1}`: a full V4 block (mHC, sliding-window attention with plain RoPE, bias-routed
MoE). There is no causal mask anywhere in a draft:

- Context: the target layers' outputs (hc-averaged, concatenated) → `main_proj` → `main_norm` =
  main_x; each stage's own `wkv` + kv_norm + RoPE + FP8 round trip turns main_x into that stage's
  "main KV" at the context token's position.
- A draft block of K rows is `[anchor, noise × (K-1)]` at positions anchor_pos .. anchor_pos+K-1.
  Every row of a block attends over the same keys: the stage's main KV of positions
  anchor_pos-W .. anchor_pos-1 (W = sliding_window; fewer at the start of a sequence) followed by
  the block's own K kv rows — bidirectional inside the block, with the per-head sink.
- After the last stage: `hc_head` collapse (x), then `norm` and the target's `head` → base logits
  of row k, which proposes the token at anchor_pos+k+1.
- Markov head, left to right: logits_k += markov_w2(markov_w1[prev_k]) with prev_0 = the anchor
  and prev_k = the token chosen at k-1 (greedy argmax).
- Confidence head: sigmoid(proj(x_k ⊕ markov_w1[prev_k])), bias-free, fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.model import numerics
from services.worker.model.attention import attend
from services.worker.model.config import ModelConfig
from services.worker.model.transformer import DeepseekV4


@dataclass(frozen=True)
class DraftBlock:
    """One sequence's draft block and the main KV it attends over."""

    anchor_token: int
    anchor_pos: int
    num_drafts: int              # K: rows of the block, tokens proposed
    context_kv: torch.Tensor     # [S, n, d]: each stage's main KV of positions anchor_pos-n ..


@dataclass(frozen=True)
class BlockProposal:
    tokens: torch.Tensor         # int64 [K]
    confidences: torch.Tensor    # fp32 [K], in [0, 1]


class DSparkNetwork:
    """The draft stages of a loaded DSpark checkpoint, computing with the target's `DeepseekV4`
    (its weights, embedding, head, and the `mtp.s.` attention and MoE layers it builds)."""

    def __init__(self, model: DeepseekV4):
        self.model = model
        cfg: ModelConfig = model.config
        self.config = cfg
        self.num_stages = cfg.num_mtp_layers
        self.layer_ids = tuple(cfg.num_hidden_layers + s for s in range(self.num_stages))
        self.last = f"mtp.{self.num_stages - 1}."

    # ---- context --------------------------------------------------------------------------------
    def context_kv(self, taps: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """taps [n, S, D] of context tokens at `positions` [n] → main KV [S, n, d] per stage."""
        cfg, w = self.config, self.model.w
        main_x = numerics.linear(taps.reshape(taps.shape[0], -1), w["mtp.0.main_proj.weight"])
        main_x = numerics.rms_norm(main_x, w["mtp.0.main_norm.weight"], cfg.rms_norm_eps)
        return torch.stack([self.model.attention[layer_id].kv(main_x, positions)
                            for layer_id in self.layer_ids])

    def empty_context(self) -> torch.Tensor:
        """The main KV of a block at position 0: no context rows."""
        embed = self.model.w["embed.weight"]
        return embed.new_zeros(self.num_stages, 0, self.config.head_dim)

    # ---- stages -------------------------------------------------------------------------------
    def propose(self, blocks: list[DraftBlock]) -> list[BlockProposal]:
        """Every block through the stages in one batch, then the heads."""
        h, rows = self.stage_streams(blocks)
        if not blocks:  # an idle rank that joined the collectives
            return []
        x = self.model.collapse(h, self.last)
        base = self.model.head_logits(x, self.last)
        return self._heads(blocks, rows, base, x)

    def stage_streams(self, blocks: list[DraftBlock]) -> tuple[torch.Tensor, list[slice]]:
        """Every block through the stages in one batch → the last stage's hc streams
        [rows, hc, D] and each block's rows (training computes its losses from them)."""
        tokens, positions, rows = self._layout(blocks)
        self.model.collectives.begin_step(tokens.shape[0])
        h = self.model.embed(tokens).unsqueeze(1).repeat(1, self.config.hc_mult, 1)
        for stage, layer_id in enumerate(self.layer_ids):
            h = self.model.block_with(
                layer_id, h, tokens,
                lambda y, s=stage: self._attention(s, y, positions, blocks, rows))
        return h, rows

    def _layout(self, blocks: list[DraftBlock]
                ) -> tuple[torch.Tensor, torch.Tensor, list[slice]]:
        """Flat token ids and positions of every block, and each block's rows."""
        noise = self.config.dspark_noise_token_id
        ids: list[int] = []
        positions: list[int] = []
        rows: list[slice] = []
        for block in blocks:
            rows.append(slice(len(ids), len(ids) + block.num_drafts))
            ids += [block.anchor_token] + [noise] * (block.num_drafts - 1)
            positions += range(block.anchor_pos, block.anchor_pos + block.num_drafts)
        device = self.model.w["embed.weight"].device
        return (torch.tensor(ids, dtype=torch.int64, device=device),
                torch.tensor(positions, dtype=torch.int64, device=device), rows)

    def _attention(self, stage: int, y: torch.Tensor, positions: torch.Tensor,
                   blocks: list[DraftBlock], rows: list[slice]) -> torch.Tensor:
        """Stage attention: projections over all rows; per block, every row over the stage's
        main KV ⊕ the block's own kv (no causal mask)."""
        layer = self.model.attention[self.layer_ids[stage]]
        _, q = layer.queries(y, positions)
        kv = layer.kv(y, positions)
        out = torch.empty_like(q)
        sink = self.model.w[layer.prefix + "attn_sink"]
        for block, r in zip(blocks, rows):
            keys = torch.cat([block.context_kv[stage].to(kv.dtype), kv[r]])
            n = r.stop - r.start
            keys = keys.unsqueeze(0).expand(n, -1, -1)
            visible = torch.ones(keys.shape[:2], dtype=torch.bool, device=keys.device)
            out[r] = attend(q[r], keys, visible, keys[:, :0], torch.zeros(
                n, dtype=torch.int64, device=keys.device), sink, self.config.head_dim ** -0.5)
        return layer.output(layer.rope(out, positions, inverse=True))

    # ---- heads --------------------------------------------------------------------------------
    def _heads(self, blocks: list[DraftBlock], rows: list[slice], base: torch.Tensor,
               x: torch.Tensor) -> list[BlockProposal]:
        """Markov-corrected greedy choice left to right, all blocks at once per step; then the
        confidence of every row from its hidden and its predecessor."""
        longest = max(block.num_drafts for block in blocks)
        prev = torch.tensor([block.anchor_token for block in blocks], device=base.device)
        chosen = torch.zeros(len(blocks), longest, dtype=torch.int64, device=base.device)
        predecessors = torch.zeros_like(chosen)
        for k in range(longest):
            live = [b for b, block in enumerate(blocks) if block.num_drafts > k]
            step_rows = torch.tensor([rows[b].start + k for b in live], device=base.device)
            bias = self.markov_bias(prev[live])
            predecessors[live, k] = prev[live]
            chosen[live, k] = (base[step_rows] + bias).argmax(dim=-1)
            prev = chosen[:, k].clone()
        flat_prev = torch.cat([predecessors[b, :block.num_drafts] for b, block in
                               enumerate(blocks)])
        confidences = self.confidence(x, flat_prev)
        return [BlockProposal(tokens=chosen[b, :block.num_drafts], confidences=confidences[r])
                for b, (block, r) in enumerate(zip(blocks, rows))]

    def markov_bias(self, prev: torch.Tensor) -> torch.Tensor:
        """Predecessor ids [n] → the Markov head's fp32 logit correction [n, V]."""
        w1 = self.model.w[self.last + "markov_head.markov_w1.weight"]
        w2 = self.model.w[self.last + "markov_head.markov_w2.weight"]
        return numerics.wide_linear(w1[prev].float(), w2)

    def confidence(self, x: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Collapsed rows [n, D] and their predecessor ids [n] → confidences [n] in [0, 1]."""
        prev_latent = self.model.w[self.last + "markov_head.markov_w1.weight"][prev]
        features = torch.cat([x.float(), prev_latent.float()], dim=-1)
        proj = self.model.w[self.last + "confidence_head.proj.weight"]
        return torch.sigmoid(numerics.linear(features, proj)[:, 0])
