"""A straightforward DSpark draft, written from the published description for the tests only.

It shares nothing with `services/worker/model/dspark*.py`: weights are read by name, attention is a
loop over heads with an explicit softmax and sink, the Markov head and the confidence head are
spelled out per position. The target's own building blocks (mHC, MoE, RMSNorm, RoPE, the FP8 round
trip) are reused: they are the target's and are tested against the official golden elsewhere.
"""
from __future__ import annotations

import torch

from services.worker.model import hyper_connections as mhc
from services.worker.model import numerics
from services.worker.model.config import ModelConfig
from services.worker.model.transformer import DeepseekV4


def draft(model: DeepseekV4, taps: torch.Tensor, anchor: int, num_drafts: int
          ) -> tuple[list[int], list[float]]:
    """taps [anchor_pos, S, D]: the hc-averaged tap outputs of every position before the anchor.
    → (tokens for anchor_pos+1 .., confidences)."""
    cfg, w = model.config, model.w
    pos = taps.shape[0]
    stages = cfg.num_mtp_layers
    first = max(0, pos - cfg.sliding_window)
    main_x = taps[first:].reshape(pos - first, -1) @ w["mtp.0.main_proj.weight"].T
    main_x = numerics.rms_norm(main_x, w["mtp.0.main_norm.weight"], cfg.rms_norm_eps)
    ctx_pos = torch.arange(first, pos)
    ids = torch.tensor([anchor] + [cfg.dspark_noise_token_id] * (num_drafts - 1))
    blk_pos = torch.arange(pos, pos + num_drafts)
    h = w["embed.weight"][ids].unsqueeze(1).repeat(1, cfg.hc_mult, 1)
    for s in range(stages):
        p = f"mtp.{s}."
        h = _block(model, p, cfg.num_hidden_layers + s, h, ids, main_x, ctx_pos, blk_pos)
    last = f"mtp.{stages - 1}."
    x = mhc.hc_head(h, model.w.hc(last, "head"), cfg.hc_eps, cfg.rms_norm_eps)
    base = numerics.rms_norm(x, w[last + "norm.weight"], cfg.rms_norm_eps).float() \
        @ w["head.weight"].float().T
    w1, w2 = w[last + "markov_head.markov_w1.weight"], w[last + "markov_head.markov_w2.weight"]
    proj = w[last + "confidence_head.proj.weight"][0]
    tokens: list[int] = []
    confidences: list[float] = []
    prev = anchor
    for k in range(num_drafts):
        logits = base[k] + w2.float() @ w1[prev].float()
        confidences.append(torch.sigmoid(torch.cat([x[k].float(), w1[prev].float()]) @ proj)
                           .item())
        prev = int(logits.argmax())
        tokens.append(prev)
    return tokens, confidences


def _block(model: DeepseekV4, p: str, layer_id: int, h: torch.Tensor, ids: torch.Tensor,
           main_x: torch.Tensor, ctx_pos: torch.Tensor, blk_pos: torch.Tensor) -> torch.Tensor:
    cfg, w = model.config, model.w
    args = (cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)
    y, post, comb = mhc.hc_pre(h, model.w.hc(p, "attn"), *args)
    y = numerics.rms_norm(y, w[p + "attn_norm.weight"], cfg.rms_norm_eps)
    h = mhc.hc_post(_attention(cfg, w, p + "attn.", y, main_x, ctx_pos, blk_pos), h, post, comb)
    y, post, comb = mhc.hc_pre(h, model.w.hc(p, "ffn"), *args)
    y = numerics.rms_norm(y, w[p + "ffn_norm.weight"], cfg.rms_norm_eps)
    return mhc.hc_post(model.moe[layer_id].forward(y, ids), h, post, comb)


def _kv(cfg: ModelConfig, w, p: str, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    rd = cfg.qk_rope_head_dim
    kv = numerics.rms_norm(x @ w[p + "wkv.weight"].T, w[p + "kv_norm.weight"], cfg.rms_norm_eps)
    kv = _rope(cfg, kv, positions)
    return torch.cat([numerics.fp8_round_trip(kv[:, :-rd], 64), kv[:, -rd:]], dim=-1)


def _rope(cfg: ModelConfig, x: torch.Tensor, positions: torch.Tensor, inverse: bool = False
          ) -> torch.Tensor:
    inv_freq = numerics.rope_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, None)
    return numerics.apply_rope(x, numerics.rope_table(inv_freq, positions),
                               cfg.qk_rope_head_dim, inverse)


def _attention(cfg: ModelConfig, w, p: str, y: torch.Tensor, main_x: torch.Tensor,
               ctx_pos: torch.Tensor, blk_pos: torch.Tensor) -> torch.Tensor:
    """Every block row attends over the stage's context kv and every block row's kv."""
    eps, d, heads = cfg.rms_norm_eps, cfg.head_dim, cfg.num_attention_heads
    qr = numerics.rms_norm(y @ w[p + "wq_a.weight"].T, w[p + "q_norm.weight"], eps)
    q = (qr @ w[p + "wq_b.weight"].T).view(-1, heads, d)
    q = _rope(cfg, numerics.rms_norm(q, None, eps), blk_pos)
    keys = torch.cat([_kv(cfg, w, p, main_x, ctx_pos), _kv(cfg, w, p, y, blk_pos)]).float()
    sink = w[p + "attn_sink"].float()
    out = torch.zeros(q.shape, dtype=torch.float32)
    for row in range(q.shape[0]):
        for head in range(heads):
            scores = keys @ q[row, head].float() * d ** -0.5
            weights = torch.exp(scores - torch.logaddexp(torch.logsumexp(scores, 0), sink[head]))
            out[row, head] = weights @ keys
    out = _rope(cfg, out.to(q.dtype), blk_pos, inverse=True)
    groups = cfg.o_groups
    wo_a = w[p + "wo_a.weight"].view(groups, cfg.o_lora_rank, -1)
    grouped = out.reshape(out.shape[0], groups, -1)
    low = torch.cat([grouped[:, g] @ wo_a[g].T for g in range(groups)], dim=-1)
    return low @ w[p + "wo_b.weight"].T
