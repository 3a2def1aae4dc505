"""What a parsed `ModelConfig` must satisfy for the runtime to serve it (one model type and router,
one K/V head, known compression ratios and expert storage, a complete DSpark draft); each failed
check is a `ConfigError` naming the field."""
from __future__ import annotations

from typing import TYPE_CHECKING

from services.worker.model.config_fields import DSPARK_FIELDS, INT_FIELDS, ConfigError

if TYPE_CHECKING:
    from services.worker.model.config import ModelConfig

SUPPORTED_MODEL_TYPE = "deepseek_v4"
SUPPORTED_SCORING_FUNC = "sqrtsoftplus"
SUPPORTED_COMPRESS_RATIOS = frozenset({0, 4, 128})
SUPPORTED_EXPERT_DTYPES = frozenset({"fp4", "fp8"})


def validate(config: ModelConfig) -> None:
    _check(config.model_type == SUPPORTED_MODEL_TYPE, "model_type",
           f"unsupported {config.model_type!r} (only {SUPPORTED_MODEL_TYPE!r})")
    _check(config.scoring_func == SUPPORTED_SCORING_FUNC, "scoring_func",
           f"unsupported {config.scoring_func!r} (only {SUPPORTED_SCORING_FUNC!r})")
    _check(config.num_key_value_heads == 1, "num_key_value_heads",
           f"must be 1 (one shared K/V vector), got {config.num_key_value_heads}")
    for name in INT_FIELDS:
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
    given = [name for name in DSPARK_FIELDS if getattr(config, name) is not None]
    if not given:
        return
    for name in DSPARK_FIELDS:
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
