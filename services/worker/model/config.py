"""`ModelConfig`: the DeepSeek-V4 architecture as read from a Hugging Face `config.json`.

Field names are the `config.json` keys verbatim, so a reader of the checkpoint and of this file see
the same words. Parsing (config_fields.py) and the checks (config_checks.py) reject everything the
runtime cannot serve (another model type, another router, several KV heads, unknown compression
ratios or quantization) with a `ConfigError` that names the offending field.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from services.worker.model.config_checks import validate
from services.worker.model.config_fields import (ConfigError, QuantizationConfig, RopeScaling,
                                                 parse_fields)


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    num_key_value_heads: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    vocab_size: int
    bos_token_id: int
    eos_token_id: int
    rms_norm_eps: float
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    scoring_func: str
    routed_scaling_factor: float
    num_hash_layers: int
    swiglu_limit: float
    sliding_window: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rope_theta: float
    compress_rope_theta: float
    rope_scaling: Optional[RopeScaling]
    compress_ratios: tuple[int, ...]
    num_nextn_predict_layers: int
    max_position_embeddings: int
    # None: unquantized checkpoint (every projection stored in bf16, no `.scale` tensors).
    quantization_config: Optional[QuantizationConfig]
    # Storage of the routed experts: "fp4" (packed e2m1, 1x32 scales) or "fp8" (like the other
    # projections); None when the checkpoint is unquantized. Absent from the released config.json,
    # whose experts are FP4, hence the "fp4" default when `quantization_config` is present.
    expert_dtype: Optional[str]
    dspark_block_size: Optional[int] = None
    dspark_noise_token_id: Optional[int] = None
    dspark_target_layer_ids: Optional[tuple[int, ...]] = None
    dspark_markov_rank: Optional[int] = None
    n_mtp_layers: Optional[int] = None

    @classmethod
    def from_json_file(cls, path: Union[str, Path]) -> "ModelConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read model config {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: config.json must hold a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        config = cls(**parse_fields(data))
        validate(config)
        return config

    @property
    def num_mtp_layers(self) -> int:
        """Blocks stored under `mtp.N.`: the DSpark draft stages, else the MTP layers."""
        if self.n_mtp_layers is not None:
            return self.n_mtp_layers
        if self.dspark_target_layer_ids is not None:
            return len(self.dspark_target_layer_ids)
        return self.num_nextn_predict_layers

    @property
    def has_dspark(self) -> bool:
        """The checkpoint carries a DSpark draft: its `mtp.N.` blocks are draft stages."""
        return self.dspark_target_layer_ids is not None

    @property
    def num_layers_total(self) -> int:
        """Main layers plus MTP blocks: the length of `compress_ratios`."""
        return self.num_hidden_layers + self.num_mtp_layers

    @property
    def hc_mix_size(self) -> int:
        """Mixing numbers per token of a block's hyper-connection: (2 + hc) * hc."""
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def qk_nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def fp8_block_size(self) -> tuple[int, int]:
        if self.quantization_config is None:
            raise ConfigError("quantization_config: checkpoint is not quantized")
        return self.quantization_config.weight_block_size

    def layer_ratio(self, layer_id: int) -> int:
        """Compression ratio (0, 4 or 128) of layer `layer_id` (MTP blocks follow the main)."""
        return self.compress_ratios[layer_id]

    def is_hash_layer(self, layer_id: int) -> bool:
        """Hash-routed MoE (`gate.tid2eid`): the first `num_hash_layers` main layers."""
        return layer_id < self.num_hash_layers

    def to_dict(self) -> dict[str, Any]:
        """The parsed fields as JSON-ready values (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the parsed fields (unknown config.json keys excluded)."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
