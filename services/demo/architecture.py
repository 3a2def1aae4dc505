"""The demo model's shape: DeepSeek-V4-Flash's config.json with small sizes.

Every feature of the real architecture is present — mHC (4 copies, 20 Sinkhorn rounds), a
sliding-window layer, a CSA layer (ratio 4, compressor with overlap, indexer with top-k), an HCA
layer (ratio 128), hash-routed and bias-routed MoE with a shared expert, FP8 e4m3 projections with
ue8m0 128×128 scales, FP4 routed experts, the V4 vocabulary and one MTP layer — at sizes a 2-core
CPU trains in about an hour.

Shape choices: 4 heads, 4 output groups and 16 routed experts split evenly over the 16-rank
topology (TP 4: one head and one group per rank; EP 16: one expert per rank). The window is
Flash's 128 tokens: a user message plus the call that copies from it fit in it, while a prompt with
its tool list (400–900 tokens) is several windows long, so the CSA layer's indexer chooses 16 of up
to ~200 compressed entries and the HCA layer sees 3–7 entries.
"""
from __future__ import annotations

import json

from services.worker.model.config import ModelConfig
from services.worker.model.tiny_presets import FLASH_CONFIG

DEMO_LAYERS = 4
DEMO_OVERRIDES: dict = {
    "hidden_size": 256, "num_hidden_layers": DEMO_LAYERS, "compress_ratios": [0, 4, 128, 0, 0],
    "num_attention_heads": 4, "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128,
    "o_groups": 4, "o_lora_rank": 64, "n_routed_experts": 16, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "moe_intermediate_size": 128, "num_hash_layers": 1,
    "sliding_window": 128, "index_n_heads": 4, "index_head_dim": 64, "index_topk": 16,
    "max_position_embeddings": 16384,
}


def demo_config_json(layers: int = DEMO_LAYERS) -> dict:
    """The config.json of the demo checkpoint; `layers` past the four are sliding-window layers
    after them (`train-demo --layers`, grown from a four-layer run: warm_start.py)."""
    if layers < DEMO_LAYERS:
        raise ValueError(f"the demo model has at least {DEMO_LAYERS} layers, not {layers}")
    config = json.loads(json.dumps(FLASH_CONFIG))
    config.update(json.loads(json.dumps(DEMO_OVERRIDES)))
    ratios = config["compress_ratios"]
    config["num_hidden_layers"] = layers
    config["compress_ratios"] = ratios[:DEMO_LAYERS] + [0] * (layers - DEMO_LAYERS) + ratios[-1:]
    return config


def demo_config(layers: int = DEMO_LAYERS) -> ModelConfig:
    return ModelConfig.from_dict(demo_config_json(layers))


# The demo's DSpark variant (draft.py): the demo target with one draft stage in place of its MTP
# block, reading the last layer's output, trained for K = 7; Markov rank 16. One stage
# (~1.5 MB, the size of the MTP block) keeps the committed weights under the 15 MB.
DRAFT_OVERRIDES: dict = {
    "n_mtp_layers": 1, "dspark_block_size": 8, "dspark_noise_token_id": 128799,
    "dspark_markov_rank": 16,
}


def draft_config_json(target_config_json: dict) -> dict:
    """The config.json of a demo target's DSpark variant: its stage (a sliding-window block)
    reads the target's last layer."""
    last = target_config_json["num_hidden_layers"] - 1
    return {**target_config_json, **json.loads(json.dumps(DRAFT_OVERRIDES)),
            "compress_ratios": target_config_json["compress_ratios"][:last + 1] + [0],
            "dspark_target_layer_ids": [last]}
