"""ModelConfig: parsing DeepSeek-V4 config.json files and refusing what the runtime cannot serve."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.worker.model.config import ModelConfig
from services.worker.model.config_fields import ConfigError
from services.worker.model.tiny_presets import FLASH_CONFIG, preset_config


def flash() -> dict:
    return json.loads(json.dumps(FLASH_CONFIG))


def test_flash_config_parses_with_derived_sizes() -> None:
    config = ModelConfig.from_dict(flash())
    assert config.hidden_size == 4096 and config.num_attention_heads == 64
    assert config.num_layers_total == 44
    assert [config.layer_ratio(i) for i in range(4)] == [0, 0, 4, 128]
    assert config.layer_ratio(43) == 0  # the MTP block
    assert config.hc_mix_size == 24
    assert config.qk_nope_head_dim == 448
    assert config.rope_scaling.factor == 16
    assert config.rope_scaling.original_max_position_embeddings == 65536
    assert config.quantization_config.weight_block_size == (128, 128)
    assert config.expert_dtype == "fp4"
    assert [config.is_hash_layer(i) for i in range(4)] == [True, True, True, False]


def test_from_json_file_reads_a_written_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(preset_config("tiny-a")))
    config = ModelConfig.from_json_file(path)
    assert config.swiglu_limit == 1.5 and config.routed_scaling_factor == 2.5
    assert config.compress_ratios == (0, 4, 128, 4, 0)


def test_released_config_without_expert_dtype_means_fp4_experts() -> None:
    raw = flash()
    del raw["expert_dtype"]
    assert ModelConfig.from_dict(raw).expert_dtype == "fp4"


def test_unknown_extra_keys_are_ignored_and_do_not_change_the_fingerprint() -> None:
    raw = flash()
    plain = ModelConfig.from_dict(raw)
    raw["some_future_key"] = {"x": 1}
    assert ModelConfig.from_dict(raw) == plain
    assert ModelConfig.from_dict(raw).fingerprint() == plain.fingerprint()


def test_fingerprint_changes_with_any_parsed_field() -> None:
    raw = flash()
    base = ModelConfig.from_dict(raw).fingerprint()
    raw["swiglu_limit"] = 9.0
    assert ModelConfig.from_dict(raw).fingerprint() != base


def test_dspark_fields_are_parsed_and_mtp_blocks_follow_n_mtp_layers() -> None:
    raw = flash()
    raw.update({"dspark_block_size": 5, "dspark_noise_token_id": 128799,
                "dspark_target_layer_ids": [40, 41, 42], "dspark_markov_rank": 256,
                "n_mtp_layers": 3, "compress_ratios": FLASH_CONFIG["compress_ratios"] + [0, 0]})
    config = ModelConfig.from_dict(raw)
    assert config.dspark_target_layer_ids == (40, 41, 42)
    assert config.num_mtp_layers == 3 and config.num_layers_total == 46


@pytest.mark.parametrize("field, value", [
    ("model_type", "deepseek_v3"),
    ("scoring_func", "sigmoid"),
    ("num_key_value_heads", 8),
    ("compress_ratios", [0, 4]),
    ("compress_ratios", [0, 0] + [4, 64] * 20 + [4, 0]),
    ("o_groups", 3),
    ("quantization_config", {"quant_method": "awq"}),
    ("expert_dtype", "int4"),
    ("hidden_size", "4096"),
    ("rope_scaling", {"type": "linear", "factor": 2}),
])
def test_unsupported_values_are_rejected_naming_the_field(field: str, value: object) -> None:
    raw = flash()
    raw[field] = value
    with pytest.raises(ConfigError, match=rf"^{field}"):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize("field", ["hidden_size", "compress_ratios", "scoring_func", "head_dim",
                                   "num_hash_layers", "swiglu_limit"])
def test_missing_required_key_is_rejected_naming_it(field: str) -> None:
    raw = flash()
    del raw[field]
    with pytest.raises(ConfigError, match=rf"^{field}: required"):
        ModelConfig.from_dict(raw)


def test_unreadable_file_raises_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="config.json"):
        ModelConfig.from_json_file(path)
