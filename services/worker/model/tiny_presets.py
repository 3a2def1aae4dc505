"""The configs of the tiny checkpoints: the released DeepSeek-V4-Flash `config.json` and the size
presets that override it (tiny-a, tiny-ep16, tiny-dspark, tiny-ep16-dspark, bench-1024)."""
from __future__ import annotations

import json

# The released DeepSeek-V4-Flash config.json; presets override sizes. The keys (nested ones too)
# are in the conformance generator's order, so tiny-a's config.json is byte-identical to its copy.
FLASH_CONFIG: dict = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hc_eps": 1e-06,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "head_dim": 512,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "index_topk": 512,
    "initializer_range": 0.02,
    "max_position_embeddings": 1048576,
    "model_type": "deepseek_v4",
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 43,
    "num_hash_layers": 3,
    "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "q_lora_rank": 1024,
    "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                     "original_max_position_embeddings": 65536, "type": "yarn"},
    "rope_theta": 10000,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "sliding_window": 128,
    "swiglu_limit": 10.0,
    "tie_word_embeddings": False,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.57.1",
    "use_cache": True,
    "vocab_size": 129280,
    "compress_rope_theta": 160000,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "expert_dtype": "fp4",
}

PRESETS: dict[str, dict] = {
    # The conformance checkpoint's config (../shared/conformance/dsv4-tiny-a): the golden logits
    # were computed for exactly these values.
    "tiny-a": {
        "hidden_size": 128, "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0],
        "num_attention_heads": 4, "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128,
        "o_groups": 2, "o_lora_rank": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "moe_intermediate_size": 128, "num_hash_layers": 1,
        "sliding_window": 16, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
        "hc_mult": 4, "hc_sinkhorn_iters": 20,
        # Small enough that the tiny model exercises the clamp; not the Flash value, so a
        # hard-coded 1.5 routing scale is caught.
        "routed_scaling_factor": 2.5, "swiglu_limit": 1.5,
    },
    # tiny-a's shape, widened just enough to split over the guide's 16 ranks (dp4 × tp4, ep16):
    # heads, o_groups and hidden divide by 4, 16 routed experts.
    "tiny-ep16": {
        "hidden_size": 128, "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0],
        "num_attention_heads": 8, "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128,
        "o_groups": 4, "o_lora_rank": 128, "n_routed_experts": 16, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "moe_intermediate_size": 64, "num_hash_layers": 1,
        "sliding_window": 16, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "routed_scaling_factor": 2.5, "swiglu_limit": 1.5,
    },
    # tiny-a's target plus a DSpark draft in the released format: three sliding-window stages
    # reading the outputs of layers 1..3, the released noise token and block size, a small Markov
    # rank (V x 256 would be ~190 MB of Markov head). The target is drawn first with the same
    # seed, so its tensors are byte-identical to tiny-a's.
    "tiny-dspark": {
        "hidden_size": 128, "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0, 0, 0],
        "num_attention_heads": 4, "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128,
        "o_groups": 2, "o_lora_rank": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "moe_intermediate_size": 128, "num_hash_layers": 1,
        "sliding_window": 16, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "routed_scaling_factor": 2.5, "swiglu_limit": 1.5,
        "n_mtp_layers": 3, "dspark_block_size": 5, "dspark_noise_token_id": 128799,
        "dspark_target_layer_ids": [1, 2, 3], "dspark_markov_rank": 16,
    },
    # A benchmark shape: Flash's head_dim, window, top-k and vocabulary at a quarter of the width.
    "bench-1024": {
        "hidden_size": 1024, "num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4, 0],
        "num_attention_heads": 16, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 512,
        "o_groups": 4, "o_lora_rank": 512, "n_routed_experts": 64, "num_experts_per_tok": 6,
        "n_shared_experts": 1, "moe_intermediate_size": 256, "num_hash_layers": 1,
        "index_n_heads": 16, "index_head_dim": 128,
    },
}

# tiny-ep16's target with tiny-dspark's draft: the guide's DSpark deployment (dp4 × tp4, ep16,
# K = 7) on 16 CPU ranks. The target is drawn first, so its tensors are tiny-ep16's byte for byte.
PRESETS["tiny-ep16-dspark"] = {
    **PRESETS["tiny-ep16"],
    **{key: value for key, value in PRESETS["tiny-dspark"].items()
       if key.startswith("dspark_") or key in ("n_mtp_layers", "compress_ratios")}}


def preset_config(preset: str) -> dict:
    """The config.json contents of a preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    config = json.loads(json.dumps(FLASH_CONFIG))
    config.update(json.loads(json.dumps(PRESETS[preset])))
    return config
