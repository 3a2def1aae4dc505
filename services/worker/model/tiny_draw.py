"""The random tensors of a tiny checkpoint, drawn as the conformance generator draws them
(`../shared/conformance/dsv4-tiny-a/make_tiny_checkpoint.py`): its fixed order, distributions and
exact quantisation, from one CPU generator.

Weight scales (after the conformance tiny-a checkpoint): projections N(0, (gain/sqrt(fan_in))^2)
with gain 1, except the output projections wo_b (0.3) and expert / shared-expert w2 (0.12). With
unit gains the tiny model is chaotic (one rounding or routing flip moves logits by several units);
small output projections keep each sub-layer's update to the residual stream small.
"""
from __future__ import annotations

import torch

from services.worker.model.checkpoint_specs import SCALE_SUFFIX, TensorSpec
from services.worker.model.config import ModelConfig
from services.worker.model.dequant import quantize_fp4_rows, quantize_fp8_blocks

GAINS = {"wo_b": 0.3, "w2": 0.12}
EMBED_STD = 1.0
HEAD_LOGIT_STD = 3.0
HC_MIX_STD = 0.5
HC_BASE_STD = 0.5
ATTN_SINK_STD = 1.0
APE_STD = 0.5
GATE_BIAS_STD = 0.2

# The conformance generator's draw order inside one block, and around the blocks.
_BLOCK_DRAW_ORDER = (
    "hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale",
    "attn_norm.weight", "ffn_norm.weight", "attn.wq_a.weight", "attn.q_norm.weight",
    "attn.wq_b.weight", "attn.wkv.weight", "attn.kv_norm.weight", "attn.wo_a.weight",
    "attn.wo_b.weight", "attn.attn_sink", "attn.compressor.ape", "attn.compressor.wkv.weight",
    "attn.compressor.wgate.weight", "attn.compressor.norm.weight", "attn.indexer.wq_b.weight",
    "attn.indexer.weights_proj.weight", "attn.indexer.compressor.ape",
    "attn.indexer.compressor.wkv.weight", "attn.indexer.compressor.wgate.weight",
    "attn.indexer.compressor.norm.weight", "ffn.gate.weight", "ffn.gate.tid2eid", "ffn.gate.bias",
)
_HEAD_DRAW_ORDER = ("norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale", "head.weight")
_MTP_DRAW_ORDER = ("e_proj.weight", "h_proj.weight", "enorm.weight", "hnorm.weight",
                   "norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale")


def draw_order(config: ModelConfig, specs: dict[str, TensorSpec]) -> list[str]:
    """Every tensor of `specs` in draw order, each `.scale` right after its weight. Tensors the
    conformance generator does not know (none in its presets) follow in the loader's order."""
    weights = ["embed.weight"]
    for layer_id in range(config.num_hidden_layers):
        weights += _block_draw_order(f"layers.{layer_id}.", config)
    weights += _HEAD_DRAW_ORDER
    for mtp_id in range(config.num_mtp_layers):
        prefix = f"mtp.{mtp_id}."
        weights += [prefix + leaf for leaf in _MTP_DRAW_ORDER]
        weights += _block_draw_order(prefix, config)
    order = []
    for name in weights:
        scale_name = name.removesuffix(".weight") + SCALE_SUFFIX
        order += [tensor for tensor in (name, scale_name) if tensor in specs]
    known = set(order)
    return order + [name for name in specs if name not in known]


def _block_draw_order(prefix: str, config: ModelConfig) -> list[str]:
    names = [prefix + leaf for leaf in _BLOCK_DRAW_ORDER]
    for expert in range(config.n_routed_experts):
        names += [f"{prefix}ffn.experts.{expert}.w{i}.weight" for i in (1, 2, 3)]
    return names + [f"{prefix}ffn.shared_experts.w{i}.weight" for i in (1, 2, 3)]


def draw_shard(names: list[str], specs: dict[str, TensorSpec], config: ModelConfig,
                generator: torch.Generator) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for name in names:
        if name.endswith(SCALE_SUFFIX):
            continue  # drawn together with its weight
        scale_name = name.removesuffix(".weight") + SCALE_SUFFIX
        spec = specs[name]
        if scale_name in specs:
            tensors[name], tensors[scale_name] = _draw_quantized(name, spec, config, generator)
        elif spec.dtype == torch.int64:
            tensors[name] = _draw_expert_table(spec.shape, config, generator)
        else:
            tensors[name] = _draw_float(name, spec.shape, config, generator).to(spec.dtype)
    return tensors


def _draw_quantized(name: str, spec: TensorSpec, config: ModelConfig,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if spec.dtype == torch.int8:  # packed FP4: two values per byte
        logical = (spec.shape[0], spec.shape[1] * 2)
        return quantize_fp4_rows(_draw_float(name, logical, config, generator))
    weight = _draw_float(name, spec.shape, config, generator)
    return quantize_fp8_blocks(weight, config.fp8_block_size)


def _draw_float(name: str, shape: tuple[int, ...], config: ModelConfig,
                generator: torch.Generator) -> torch.Tensor:
    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
    if name == "embed.weight":
        return _normal(shape, EMBED_STD, generator)
    if name == "head.weight":
        return _normal(shape, HEAD_LOGIT_STD / config.hidden_size ** 0.5, generator)
    if leaf.endswith("norm"):
        return _uniform(shape, 0.8, 1.2, generator)
    if leaf.startswith("hc_") and leaf.endswith("_fn"):
        # mixes = fn . (x / rms(x)) then have a std of HC_MIX_STD whatever the width.
        return _normal(shape, HC_MIX_STD / shape[1] ** 0.5, generator)
    if leaf.startswith("hc_") and leaf.endswith("_base"):
        return _normal(shape, HC_BASE_STD, generator)
    if leaf.startswith("hc_") and leaf.endswith("_scale"):
        return _uniform(shape, 0.5, 1.5, generator)
    if leaf == "attn_sink":
        return _normal(shape, ATTN_SINK_STD, generator)
    if leaf == "ape":
        return _normal(shape, APE_STD, generator)
    if leaf == "bias":
        return _normal(shape, GATE_BIAS_STD, generator)
    if len(shape) != 2:
        raise ValueError(f"no initialisation rule for tensor {name!r} of shape {shape}")
    return _normal(shape, GAINS.get(leaf, 1.0) / shape[1] ** 0.5, generator)


def _draw_expert_table(shape: tuple[int, ...], config: ModelConfig,
                       generator: torch.Generator) -> torch.Tensor:
    """Hash routing table: each token's row holds distinct expert ids."""
    vocab, top_k = shape
    keys = torch.rand(vocab, config.n_routed_experts, generator=generator)
    return keys.argsort(dim=1)[:, :top_k].to(torch.int64).contiguous()


def _normal(shape: tuple[int, ...], std: float, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float32) * std


def _uniform(shape: tuple[int, ...], low: float, high: float,
             generator: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float32)
