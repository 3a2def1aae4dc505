"""The tensors of a DeepSeek-V4 checkpoint: native names, storage dtypes and shapes.

`expected_tensors(config)` lists every tensor the runtime needs; the reader validates a checkpoint
against it and `tiny_checkpoint.py` writes exactly it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from services.worker.model.config import ModelConfig

SCALE_SUFFIX = ".scale"
WEIGHT_SUFFIX = ".weight"


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: Any  # torch.dtype, or the raw safetensors tag when torch has no such dtype



def expected_tensors(config: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor of the checkpoint (native names, storage dtypes), MTP blocks or DSpark draft
    stages included."""
    specs: dict[str, TensorSpec] = {}
    dim, vocab, hc = config.hidden_size, config.vocab_size, config.hc_mult
    specs["embed.weight"] = TensorSpec((vocab, dim), torch.bfloat16)
    for layer_id in range(config.num_hidden_layers):
        _block_specs(specs, config, f"layers.{layer_id}.", layer_id)
    specs["norm.weight"] = TensorSpec((dim,), torch.bfloat16)
    _hc_specs(specs, "hc_head", hc, hc * dim, 1)
    specs["head.weight"] = TensorSpec((vocab, dim), torch.bfloat16)
    if config.has_dspark:
        _dspark_specs(specs, config)
        return specs
    for mtp_id in range(config.num_mtp_layers):
        prefix = f"mtp.{mtp_id}."
        _linear_specs(specs, config, prefix + "e_proj", dim, dim)
        _linear_specs(specs, config, prefix + "h_proj", dim, dim)
        for norm in ("enorm", "hnorm", "norm"):
            specs[f"{prefix}{norm}.weight"] = TensorSpec((dim,), torch.bfloat16)
        _hc_specs(specs, prefix + "hc_head", hc, hc * dim, 1)
        _block_specs(specs, config, prefix, config.num_hidden_layers + mtp_id)
    return specs


def _dspark_specs(specs: dict[str, TensorSpec], config: ModelConfig) -> None:
    """DSpark draft stages `mtp.0 .. mtp.{S-1}` (SGLang's `DeepseekV4ForCausalLMDSpark` names):
    each a full block; the first adds `main_proj` (S·D → D, FP8 like the other projections) and
    `main_norm`; the last adds the head's `norm` and `hc_head_*`, the Markov head (`markov_w1`
    embedding bf16, `markov_w2` fp32) and the bias-free confidence head (fp32) over (hidden ⊕
    markov_w1[prev]). Embedding and output head are the target's."""
    dim, hc, rank = config.hidden_size, config.hc_mult, config.dspark_markov_rank
    stages = config.num_mtp_layers
    for stage in range(stages):
        _block_specs(specs, config, f"mtp.{stage}.", config.num_hidden_layers + stage)
    _linear_specs(specs, config, "mtp.0.main_proj", dim, stages * dim)
    specs["mtp.0.main_norm.weight"] = TensorSpec((dim,), torch.bfloat16)
    last = f"mtp.{stages - 1}."
    specs[last + "norm.weight"] = TensorSpec((dim,), torch.bfloat16)
    _hc_specs(specs, last + "hc_head", hc, hc * dim, 1)
    specs[last + "markov_head.markov_w1.weight"] = TensorSpec((config.vocab_size, rank),
                                                              torch.bfloat16)
    specs[last + "markov_head.markov_w2.weight"] = TensorSpec((config.vocab_size, rank),
                                                              torch.float32)
    specs[last + "confidence_head.proj.weight"] = TensorSpec((1, dim + rank), torch.float32)


def _block_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str,
                 layer_id: int) -> None:
    dim = config.hidden_size
    for kind in ("attn", "ffn"):
        _hc_specs(specs, f"{prefix}hc_{kind}", config.hc_mix_size, config.hc_mult * dim, 3)
        specs[f"{prefix}{kind}_norm.weight"] = TensorSpec((dim,), torch.bfloat16)
    _attention_specs(specs, config, prefix + "attn.", config.layer_ratio(layer_id))
    _moe_specs(specs, config, prefix + "ffn.", config.is_hash_layer(layer_id))


def _attention_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str,
                     ratio: int) -> None:
    dim, heads, head_dim = config.hidden_size, config.num_attention_heads, config.head_dim
    groups, q_rank = config.o_groups, config.q_lora_rank
    _linear_specs(specs, config, prefix + "wq_a", q_rank, dim)
    specs[prefix + "q_norm.weight"] = TensorSpec((q_rank,), torch.bfloat16)
    _linear_specs(specs, config, prefix + "wq_b", heads * head_dim, q_rank)
    _linear_specs(specs, config, prefix + "wkv", head_dim, dim)
    specs[prefix + "kv_norm.weight"] = TensorSpec((head_dim,), torch.bfloat16)
    _linear_specs(specs, config, prefix + "wo_a", groups * config.o_lora_rank,
                  heads * head_dim // groups)
    _linear_specs(specs, config, prefix + "wo_b", dim, groups * config.o_lora_rank)
    specs[prefix + "attn_sink"] = TensorSpec((heads,), torch.float32)
    if ratio == 0:
        return
    _compressor_specs(specs, config, prefix + "compressor.", ratio, head_dim)
    if ratio == 4:
        index_heads, index_dim = config.index_n_heads, config.index_head_dim
        _linear_specs(specs, config, prefix + "indexer.wq_b", index_heads * index_dim, q_rank)
        specs[prefix + "indexer.weights_proj.weight"] = TensorSpec((index_heads, dim),
                                                                   torch.bfloat16)
        _compressor_specs(specs, config, prefix + "indexer.compressor.", ratio, index_dim)


def _compressor_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str, ratio: int,
                      width: int) -> None:
    # Ratio 4 compresses overlapping windows: two halves side by side, hence the doubled width.
    pooled = 2 * width if ratio == 4 else width
    specs[prefix + "ape"] = TensorSpec((ratio, pooled), torch.float32)
    specs[prefix + "wkv.weight"] = TensorSpec((pooled, config.hidden_size), torch.bfloat16)
    specs[prefix + "wgate.weight"] = TensorSpec((pooled, config.hidden_size), torch.bfloat16)
    specs[prefix + "norm.weight"] = TensorSpec((width,), torch.bfloat16)


def _moe_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str,
               hash_routed: bool) -> None:
    dim, experts, inter = config.hidden_size, config.n_routed_experts, config.moe_intermediate_size
    specs[prefix + "gate.weight"] = TensorSpec((experts, dim), torch.bfloat16)
    if hash_routed:
        specs[prefix + "gate.tid2eid"] = TensorSpec(
            (config.vocab_size, config.num_experts_per_tok), torch.int64)
    else:
        specs[prefix + "gate.bias"] = TensorSpec((experts,), torch.float32)
    for expert in range(experts):
        for name, out_f, in_f in (("w1", inter, dim), ("w2", dim, inter), ("w3", inter, dim)):
            _expert_specs(specs, config, f"{prefix}experts.{expert}.{name}", out_f, in_f)
    shared_inter = inter * config.n_shared_experts
    for name, out_f, in_f in (("w1", shared_inter, dim), ("w2", dim, shared_inter),
                              ("w3", shared_inter, dim)):
        _linear_specs(specs, config, f"{prefix}shared_experts.{name}", out_f, in_f)


def _linear_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str, out_f: int,
                  in_f: int) -> None:
    if config.quantization_config is None:
        specs[prefix + WEIGHT_SUFFIX] = TensorSpec((out_f, in_f), torch.bfloat16)
        return
    block_rows, block_cols = config.fp8_block_size
    specs[prefix + WEIGHT_SUFFIX] = TensorSpec((out_f, in_f), torch.float8_e4m3fn)
    specs[prefix + SCALE_SUFFIX] = TensorSpec(
        (-(-out_f // block_rows), -(-in_f // block_cols)), torch.float8_e8m0fnu)


def _expert_specs(specs: dict[str, TensorSpec], config: ModelConfig, prefix: str, out_f: int,
                  in_f: int) -> None:
    if config.expert_dtype != "fp4":
        _linear_specs(specs, config, prefix, out_f, in_f)
        return
    specs[prefix + WEIGHT_SUFFIX] = TensorSpec((out_f, in_f // 2), torch.int8)
    specs[prefix + SCALE_SUFFIX] = TensorSpec((out_f, in_f // 32), torch.float8_e8m0fnu)


def _hc_specs(specs: dict[str, TensorSpec], prefix: str, rows: int, width: int,
              num_scales: int) -> None:
    specs[prefix + "_fn"] = TensorSpec((rows, width), torch.float32)
    specs[prefix + "_base"] = TensorSpec((rows,), torch.float32)
    specs[prefix + "_scale"] = TensorSpec((num_scales,), torch.float32)
