"""`ModelConfig`: the DeepSeek-V4 architecture as read from a Hugging Face `config.json`.

Field names are the `config.json` keys verbatim, so a reader of the checkpoint and of this file see
the same words. Parsing rejects everything the runtime cannot serve (another model type, another
router, several KV heads, unknown compression ratios or quantization) with a `ConfigError` that
names the offending field; unknown extra keys are ignored.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

SUPPORTED_MODEL_TYPE = "deepseek_v4"
SUPPORTED_SCORING_FUNC = "sqrtsoftplus"
SUPPORTED_COMPRESS_RATIOS = frozenset({0, 4, 128})
SUPPORTED_EXPERT_DTYPES = frozenset({"fp4", "fp8"})


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
        config = cls(**_parse_fields(data))
        _validate(config)
        return config

    # ---- derived sizes -------------------------------------------------------------------------
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


# ---- parsing -----------------------------------------------------------------------------------
_INT_FIELDS = (
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
_OPTIONAL_INT_FIELDS = (
    "dspark_block_size", "dspark_noise_token_id", "dspark_markov_rank", "n_mtp_layers",
)
_DSPARK_FIELDS = ("dspark_target_layer_ids", "dspark_noise_token_id", "dspark_markov_rank",
                  "dspark_block_size")


def _parse_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {"model_type": _required_str(data, "model_type"),
                              "scoring_func": _required_str(data, "scoring_func")}
    for name in _INT_FIELDS:
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
    for name in _OPTIONAL_INT_FIELDS:
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


# ---- validation --------------------------------------------------------------------------------
def _validate(config: ModelConfig) -> None:
    _check(config.model_type == SUPPORTED_MODEL_TYPE, "model_type",
           f"unsupported {config.model_type!r} (only {SUPPORTED_MODEL_TYPE!r})")
    _check(config.scoring_func == SUPPORTED_SCORING_FUNC, "scoring_func",
           f"unsupported {config.scoring_func!r} (only {SUPPORTED_SCORING_FUNC!r})")
    _check(config.num_key_value_heads == 1, "num_key_value_heads",
           f"must be 1 (one shared K/V vector), got {config.num_key_value_heads}")
    for name in _INT_FIELDS:
        if name not in ("bos_token_id", "eos_token_id", "num_hash_layers"):
            value = getattr(config, name)
            _check(value > 0, name, f"must be positive, got {value}")
    _check(config.num_mtp_layers >= 0, "num_nextn_predict_layers", "must not be negative")
    _check(len(config.compress_ratios) == config.num_layers_total, "compress_ratios",
           f"needs one entry per layer incl. MTP ({config.num_hidden_layers} + "
           f"{config.num_mtp_layers} = {config.num_layers_total}), "
           f"got {len(config.compress_ratios)}")
    bad = sorted(set(config.compress_ratios) - SUPPORTED_COMPRESS_RATIOS)
    _check(not bad, "compress_ratios", f"unsupported ratios {bad} (only 0, 4, 128)")
    _check(config.head_dim % config.o_groups == 0, "o_groups",
           f"head_dim {config.head_dim} is not divisible by o_groups {config.o_groups}")
    _check(config.num_attention_heads % config.o_groups == 0, "o_groups",
           f"num_attention_heads {config.num_attention_heads} is not divisible by o_groups "
           f"{config.o_groups}")
    _check(config.qk_rope_head_dim % 2 == 0 and config.qk_rope_head_dim <= config.head_dim,
           "qk_rope_head_dim", "must be even and at most head_dim")
    _check(config.num_experts_per_tok <= config.n_routed_experts, "num_experts_per_tok",
           f"{config.num_experts_per_tok} exceeds n_routed_experts {config.n_routed_experts}")
    _check(0 <= config.num_hash_layers <= config.num_hidden_layers, "num_hash_layers",
           "must lie in [0, num_hidden_layers]")
    _check(0 <= config.bos_token_id < config.vocab_size, "bos_token_id", "outside the vocabulary")
    _check(0 <= config.eos_token_id < config.vocab_size, "eos_token_id", "outside the vocabulary")
    _validate_expert_dtype(config)
    _validate_dspark(config)


def _validate_dspark(config: ModelConfig) -> None:
    """A DSpark draft needs all of its fields: one SWA stage per distinct target layer."""
    given = [name for name in _DSPARK_FIELDS if getattr(config, name) is not None]
    if not given:
        return
    for name in _DSPARK_FIELDS:
        _check(getattr(config, name) is not None, name,
               f"required with {given[0]} (a DSpark draft needs every dspark_* field)")
    targets = config.dspark_target_layer_ids
    _check(len(targets) > 0 and len(set(targets)) == len(targets), "dspark_target_layer_ids",
           f"must be distinct layer ids, got {list(targets)}")
    _check(all(0 <= t < config.num_hidden_layers for t in targets), "dspark_target_layer_ids",
           f"{list(targets)} must lie in [0, num_hidden_layers = {config.num_hidden_layers})")
    _check(config.num_mtp_layers == len(targets), "n_mtp_layers",
           f"{config.num_mtp_layers} draft stages, but dspark_target_layer_ids names "
           f"{len(targets)} (one stage per target layer)")
    stage_ratios = config.compress_ratios[config.num_hidden_layers:]
    _check(all(ratio == 0 for ratio in stage_ratios), "compress_ratios",
           f"DSpark draft stages are sliding-window only (ratio 0), got {list(stage_ratios)}")
    _check(0 <= config.dspark_noise_token_id < config.vocab_size, "dspark_noise_token_id",
           "outside the vocabulary")
    _check(config.dspark_markov_rank > 0, "dspark_markov_rank", "must be positive")
    _check(config.dspark_block_size > 0, "dspark_block_size", "must be positive")


def _validate_expert_dtype(config: ModelConfig) -> None:
    if config.quantization_config is None:
        _check(config.expert_dtype is None, "expert_dtype",
               f"{config.expert_dtype!r} needs a quantization_config")
        return
    _check(config.expert_dtype in SUPPORTED_EXPERT_DTYPES, "expert_dtype",
           f"unsupported {config.expert_dtype!r} (only 'fp4' or 'fp8')")
    if config.expert_dtype == "fp4":
        _check(config.hidden_size % 32 == 0 and config.moe_intermediate_size % 32 == 0,
               "expert_dtype", "fp4 experts need hidden_size and moe_intermediate_size % 32 == 0")


def _check(condition: bool, field: str, problem: str) -> None:
    if not condition:
        raise ConfigError(f"{field}: {problem}")
