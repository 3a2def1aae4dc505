"""`config.json` values → the typed fields of `ModelConfig`: required keys, integers and numbers,
the nested `rope_scaling` and `quantization_config` objects. Every refusal is a `ConfigError` that
names the field; unknown extra keys are ignored."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional


class ConfigError(ValueError):
    """A `config.json` the runtime cannot serve; the message names the field."""


@dataclass(frozen=True)
class RopeScaling:
    """YaRN parameters, used by the compressed (ratio 4 / 128) layers only."""

    type: str
    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float


@dataclass(frozen=True)
class QuantizationConfig:
    """Block-scaled FP8 storage of the projection weights (`quant_method` "fp8")."""

    quant_method: str
    fmt: str
    activation_scheme: str
    scale_fmt: str
    weight_block_size: tuple[int, int]


INT_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "qk_rope_head_dim",
    "num_key_value_heads", "q_lora_rank", "o_groups", "o_lora_rank", "vocab_size", "bos_token_id",
    "eos_token_id", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
    "moe_intermediate_size", "num_hash_layers", "sliding_window", "index_n_heads", "index_head_dim",
    "index_topk", "hc_mult", "hc_sinkhorn_iters", "max_position_embeddings",
)
_FLOAT_FIELDS = (
    "rms_norm_eps", "routed_scaling_factor", "swiglu_limit", "hc_eps", "rope_theta",
    "compress_rope_theta",
)
_OPTIONALINT_FIELDS = (
    "dspark_block_size", "dspark_noise_token_id", "dspark_markov_rank", "n_mtp_layers",
)
DSPARK_FIELDS = ("dspark_target_layer_ids", "dspark_noise_token_id", "dspark_markov_rank",
                  "dspark_block_size")


def parse_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {"model_type": _required_str(data, "model_type"),
                              "scoring_func": _required_str(data, "scoring_func")}
    for name in INT_FIELDS:
        fields[name] = _as_int(name, _required(data, name))
    for name in _FLOAT_FIELDS:
        fields[name] = _as_float(name, _required(data, name))
    fields["num_nextn_predict_layers"] = _as_int(
        "num_nextn_predict_layers", data.get("num_nextn_predict_layers", 0))
    fields["compress_ratios"] = _int_tuple("compress_ratios", _required(data, "compress_ratios"))
    fields["rope_scaling"] = _parse_rope_scaling(data.get("rope_scaling"))
    quant = _parse_quantization(data.get("quantization_config"))
    fields["quantization_config"] = quant
    default_expert_dtype = "fp4" if quant is not None else None
    expert_dtype = data.get("expert_dtype", default_expert_dtype)
    fields["expert_dtype"] = None if expert_dtype is None else str(expert_dtype)
    for name in _OPTIONALINT_FIELDS:
        fields[name] = None if data.get(name) is None else _as_int(name, data[name])
    targets = data.get("dspark_target_layer_ids")
    fields["dspark_target_layer_ids"] = (
        None if targets is None else _int_tuple("dspark_target_layer_ids", targets))
    return fields


def _parse_rope_scaling(raw: Any) -> Optional[RopeScaling]:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError("rope_scaling: expected an object")
    kind = raw.get("type", raw.get("rope_type"))
    if kind != "yarn":
        raise ConfigError(f"rope_scaling.type: unsupported {kind!r} (only 'yarn')")
    return RopeScaling(
        type="yarn",
        factor=_as_float("rope_scaling.factor", _required(raw, "factor", "rope_scaling.")),
        original_max_position_embeddings=_as_int(
            "rope_scaling.original_max_position_embeddings",
            _required(raw, "original_max_position_embeddings", "rope_scaling.")),
        beta_fast=_as_float("rope_scaling.beta_fast", raw.get("beta_fast", 32)),
        beta_slow=_as_float("rope_scaling.beta_slow", raw.get("beta_slow", 1)),
    )


def _parse_quantization(raw: Any) -> Optional[QuantizationConfig]:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError("quantization_config: expected an object")
    method = raw.get("quant_method")
    if method != "fp8":
        raise ConfigError(f"quantization_config.quant_method: unsupported {method!r} (only 'fp8')")
    fmt = raw.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ConfigError(f"quantization_config.fmt: unsupported {fmt!r} (only 'e4m3')")
    scale_fmt = raw.get("scale_fmt", "ue8m0")
    if scale_fmt != "ue8m0":
        raise ConfigError(
            f"quantization_config.scale_fmt: unsupported {scale_fmt!r} (only 'ue8m0')")
    block = _int_tuple("quantization_config.weight_block_size",
                       raw.get("weight_block_size", [128, 128]))
    if len(block) != 2 or min(block) <= 0:
        raise ConfigError(
            f"quantization_config.weight_block_size: expected two positive ints, got {list(block)}")
    return QuantizationConfig(quant_method="fp8", fmt=fmt,
                              activation_scheme=str(raw.get("activation_scheme", "dynamic")),
                              scale_fmt=scale_fmt, weight_block_size=(block[0], block[1]))


def _required(data: Mapping[str, Any], name: str, prefix: str = "") -> Any:
    if name not in data or data[name] is None:
        raise ConfigError(f"{prefix}{name}: required key is missing from config.json")
    return data[name]


def _required_str(data: Mapping[str, Any], name: str) -> str:
    value = _required(data, name)
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    return value


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    return value


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    return float(value)


def _int_tuple(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name}: expected a list of integers, got {value!r}")
    return tuple(_as_int(name, item) for item in value)
