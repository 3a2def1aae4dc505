"""Checkpoint storage formats and loading: exact dequantization, shards, aliases, validation."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from services.worker.model.checkpoint import (
    CheckpointError,
    CheckpointReader,
    expected_tensors,
    native_name,
)
from services.worker.model.config import ModelConfig
from services.worker.model.dequant import (
    dequant_fp4_rows,
    dequant_fp8_blocks,
    quantize_fp4_rows,
    quantize_fp8_blocks,
)
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint

E8M0_ONE = 127  # biased exponent of 2**0


def e8m0(exponents: torch.Tensor) -> torch.Tensor:
    return (exponents + E8M0_ONE).to(torch.uint8).view(torch.float8_e8m0fnu)


# ---- FP8 ---------------------------------------------------------------------------------------
def test_fp8_dequant_multiplies_each_128x128_tile_by_its_power_of_two() -> None:
    values = torch.tensor([1.0, -0.5, 448.0, 2.0 ** -9, 0.0, -3.25])  # all exact in e4m3
    weight = values.repeat(256 * 384 // 6).view(256, 384)
    exponents = torch.tensor([[0, 3, -2], [-10, 5, 1]])
    dequant = dequant_fp8_blocks(weight.to(torch.float8_e4m3fn), e8m0(exponents))
    expected = weight * torch.ldexp(torch.ones(2, 3), exponents).repeat_interleave(
        128, 0).repeat_interleave(128, 1)
    assert torch.equal(dequant, expected)


def test_fp8_round_trip_is_exact_for_representable_weights() -> None:
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (256, 256), generator=generator, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # drop the NaN encodings
    exact = codes.view(torch.float8_e4m3fn).float() * 2.0 ** -7
    quantized, scale = quantize_fp8_blocks(exact)
    assert torch.equal(dequant_fp8_blocks(quantized, scale), exact)


def test_fp8_shapes_not_divisible_by_the_block_use_partial_edge_tiles() -> None:
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(200, 300, generator=generator)
    quantized, scale = quantize_fp8_blocks(weight)
    assert tuple(scale.shape) == (2, 3)
    dequant = dequant_fp8_blocks(quantized, scale)
    # e4m3 keeps 3 mantissa bits: relative error at most 2**-4 above the tile's smallest normal
    assert torch.all((dequant - weight).abs() <= weight.abs() * 2.0 ** -4 + 2.0 ** -6)
    requantized, rescale = quantize_fp8_blocks(dequant)
    assert torch.equal(requantized.view(torch.uint8), quantized.view(torch.uint8))
    assert torch.equal(rescale.view(torch.uint8), scale.view(torch.uint8))


def test_fp8_dequant_is_exact_in_bfloat16() -> None:
    generator = torch.Generator().manual_seed(2)
    quantized, scale = quantize_fp8_blocks(torch.randn(128, 256, generator=generator))
    as_f32 = dequant_fp8_blocks(quantized, scale, dtype=torch.float32)
    as_bf16 = dequant_fp8_blocks(quantized, scale, dtype=torch.bfloat16)
    assert as_bf16.dtype == torch.bfloat16 and torch.equal(as_bf16.float(), as_f32)


# ---- FP4 ---------------------------------------------------------------------------------------
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_fp4_bytes_decode_low_nibble_first_with_row_block_scales() -> None:
    # byte = low code | high code << 4; code 8..15 are the negatives of 0..7
    low = torch.arange(16, dtype=torch.uint8).repeat(2)            # 32 bytes -> 64 values
    high = torch.arange(15, -1, -1, dtype=torch.uint8).repeat(2)
    packed = (low | (high << 4)).view(torch.int8).view(1, 32)
    scale = e8m0(torch.tensor([[1, -1]]))
    table = torch.tensor(E2M1 + [-v for v in E2M1])
    pairs = torch.stack([table[low.long()], table[high.long()]], dim=-1).flatten()
    expected = pairs * torch.tensor([2.0] * 32 + [0.5] * 32)
    assert torch.equal(dequant_fp4_rows(packed, scale), expected.view(1, 64))


def test_fp4_round_trip_is_exact_for_grid_values_times_block_scales() -> None:
    generator = torch.Generator().manual_seed(3)
    grid = torch.tensor(E2M1 + [-v for v in E2M1[1:]])
    values = grid[torch.randint(0, len(grid), (64, 256), generator=generator)]
    values[:, ::32] = 6.0  # every block reaches the top of the grid, so its scale is exact
    block_scale = torch.ldexp(torch.ones(64, 8), torch.randint(-8, 8, (64, 8), generator=generator))
    exact = values * block_scale.repeat_interleave(32, dim=1)
    packed, scale = quantize_fp4_rows(exact)
    assert packed.dtype == torch.int8 and tuple(packed.shape) == (64, 128)
    assert tuple(scale.shape) == (64, 8)
    assert torch.equal(dequant_fp4_rows(packed, scale), exact)
    assert torch.equal(dequant_fp4_rows(packed, scale, torch.bfloat16).float(), exact)


def test_fp4_quantizer_rounds_ties_to_even_codes() -> None:
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    nearest_even = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    row = torch.tensor(ties + [-t for t in ties] + [6.0] + [0.0] * 17).view(1, 32)
    packed, scale = quantize_fp4_rows(row)
    expected = torch.tensor(nearest_even + [-v for v in nearest_even] + [6.0] + [0.0] * 17)
    assert torch.equal(dequant_fp4_rows(packed, scale).view(-1), expected)


# ---- the reader on generated checkpoints -------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_config(tiny_model_dir: Path) -> ModelConfig:
    return ModelConfig.from_json_file(tiny_model_dir / "config.json")


@pytest.fixture(scope="module")
def tiny_weights(tiny_model_dir: Path, tiny_config: ModelConfig) -> dict[str, torch.Tensor]:
    with CheckpointReader(tiny_model_dir) as reader:
        return reader.load_all(tiny_config)


def assert_same_tensors(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for name, tensor in left.items():
        assert tensor.dtype == right[name].dtype and torch.equal(tensor, right[name]), name


def test_load_all_returns_every_weight_dequantized_without_scales(
        tiny_weights: dict[str, torch.Tensor], tiny_config: ModelConfig) -> None:
    expected = expected_tensors(tiny_config)
    assert set(tiny_weights) == {name for name in expected if not name.endswith(".scale")}
    assert tiny_weights["layers.1.ffn.experts.3.w2.weight"].shape == (128, 128)  # unpacked FP4
    assert tiny_weights["layers.0.attn.wo_a.weight"].shape == (256, 256)
    assert tiny_weights["layers.0.ffn.gate.tid2eid"].dtype == torch.int64
    assert tiny_weights["mtp.0.e_proj.weight"].dtype == torch.float32
    assert all(torch.isfinite(t).all() for t in tiny_weights.values() if t.is_floating_point())


def test_load_all_in_bfloat16_keeps_float32_parameters_float32(tiny_model_dir: Path,
                                                                tiny_config: ModelConfig) -> None:
    with CheckpointReader(tiny_model_dir) as reader:
        weights = reader.load_all(tiny_config, dtype=torch.bfloat16)
    assert weights["layers.2.attn.wq_b.weight"].dtype == torch.bfloat16
    assert weights["embed.weight"].dtype == torch.bfloat16
    assert weights["layers.2.hc_attn_fn"].dtype == torch.float32
    assert weights["layers.2.attn.compressor.ape"].dtype == torch.float32


def test_load_dequantizes_a_weight_with_its_scale_companion(tiny_model_dir: Path) -> None:
    with CheckpointReader(tiny_model_dir) as reader:
        raw = reader.load_raw("layers.3.attn.wq_a.weight")
        scale = reader.load_raw("layers.3.attn.wq_a.scale")
        assert raw.dtype == torch.float8_e4m3fn and scale.dtype == torch.float8_e8m0fnu
        assert torch.equal(reader.load("layers.3.attn.wq_a.weight"), dequant_fp8_blocks(raw, scale))


@pytest.fixture(scope="module")
def three_shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-3-shards"), num_shards=3)


def test_three_shards_with_an_index_load_identically_to_one_shard(
        three_shard_dir: Path, tiny_config: ModelConfig,
        tiny_weights: dict[str, torch.Tensor]) -> None:
    index = json.loads((three_shard_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    with CheckpointReader(three_shard_dir) as reader:
        assert_same_tensors(reader.load_all(tiny_config), tiny_weights)


def hf_style(name: str) -> str:
    """The HF-style spelling that some published copies use."""
    renamed = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight"}
    if name in renamed:
        return renamed[name]
    name = name.replace(".attn.", ".self_attn.").replace(".ffn.", ".mlp.")
    name = name.replace("gate.bias", "gate.e_score_correction_bias")
    if name.endswith(".scale"):
        name = name[: -len(".scale")] + ".weight_scale_inv"
    return "model." + name


def test_hf_style_alias_copy_without_index_loads_identically(
        tmp_path: Path, tiny_model_dir: Path, tiny_config: ModelConfig,
        tiny_weights: dict[str, torch.Tensor]) -> None:
    with CheckpointReader(tiny_model_dir) as reader:
        renamed = {hf_style(name): reader.load_raw(name) for name in reader.names()}
    alias = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert native_name(alias) == "layers.1.ffn.gate.bias"
    save_file(renamed, str(tmp_path / "model.safetensors"))
    with CheckpointReader(tmp_path) as reader:
        assert "layers.1.attn.wq_a.scale" in reader
        assert_same_tensors(reader.load_all(tiny_config), tiny_weights)


def copy_with_index(source: Path, dest: Path, weight_map: dict[str, str]) -> Path:
    """A checkpoint directory reusing `source`'s shards (symlinked) under a new index."""
    dest.mkdir()
    for path in source.iterdir():
        if path.name != "model.safetensors.index.json":
            (dest / path.name).symlink_to(path)
    index = {"metadata": {}, "weight_map": weight_map}
    (dest / "model.safetensors.index.json").write_text(json.dumps(index))
    return dest


def tiny_weight_map(tiny_model_dir: Path) -> dict[str, str]:
    return json.loads((tiny_model_dir / "model.safetensors.index.json").read_text())["weight_map"]


def with_extra_shard(tiny_model_dir: Path, tmp_path: Path, shard: str, tensors: dict[str, torch.Tensor],
                     routed: str) -> Path:
    """The tiny checkpoint plus one extra shard holding `tensors`, its index routing `routed` there."""
    source = tmp_path / "extra"
    source.mkdir()
    save_file(tensors, str(source / shard))
    weight_map = tiny_weight_map(tiny_model_dir)
    weight_map[routed] = shard
    broken = copy_with_index(tiny_model_dir, tmp_path / "broken", weight_map)
    (broken / shard).symlink_to(source / shard)
    return broken


def test_tensor_absent_from_every_shard_fails_naming_it(
        tmp_path: Path, tiny_model_dir: Path, tiny_config: ModelConfig) -> None:
    weight_map = tiny_weight_map(tiny_model_dir)
    del weight_map["layers.2.attn.compressor.wgate.weight"]
    broken = copy_with_index(tiny_model_dir, tmp_path / "broken", weight_map)
    with CheckpointReader(broken) as reader, pytest.raises(CheckpointError) as info:
        reader.load_all(tiny_config)
    assert "'layers.2.attn.compressor.wgate.weight' is missing" in str(info.value)


def test_index_entry_whose_shard_lacks_the_tensor_fails_naming_tensor_and_shard(
        tmp_path: Path, tiny_model_dir: Path, tiny_config: ModelConfig) -> None:
    broken = with_extra_shard(tiny_model_dir, tmp_path, "model-extra.safetensors",
                              {"unrelated": torch.zeros(1)}, routed="mtp.0.hnorm.weight")
    with CheckpointReader(broken) as reader, pytest.raises(CheckpointError) as info:
        reader.load_all(tiny_config)
    assert "'mtp.0.hnorm.weight'" in str(info.value)
    assert "model-extra.safetensors" in str(info.value)


def test_mis_shaped_tensor_fails_naming_tensor_shard_and_shapes(
        tmp_path: Path, tiny_model_dir: Path, tiny_config: ModelConfig) -> None:
    broken = with_extra_shard(tiny_model_dir, tmp_path, "model-bad.safetensors",
                              {"layers.1.attn.attn_sink": torch.zeros(5)}, routed="layers.1.attn.attn_sink")
    with CheckpointReader(broken) as reader, pytest.raises(CheckpointError) as info:
        reader.load_all(tiny_config)
    message = str(info.value)
    assert "'layers.1.attn.attn_sink'" in message and "model-bad.safetensors" in message
    assert "[5]" in message and "[4]" in message


def test_wrong_storage_dtype_fails_naming_the_tensor(
        tmp_path: Path, tiny_model_dir: Path, tiny_config: ModelConfig) -> None:
    broken = with_extra_shard(tiny_model_dir, tmp_path, "model-f32.safetensors",
                              {"norm.weight": torch.ones(128)}, routed="norm.weight")  # f32, not bf16
    with CheckpointReader(broken) as reader, pytest.raises(CheckpointError,
                                                           match=r"'norm.weight'.*float32"):
        reader.validate(tiny_config)


def test_missing_shard_file_fails_naming_it(tmp_path: Path, tiny_model_dir: Path,
                                            tiny_config: ModelConfig) -> None:
    weight_map = tiny_weight_map(tiny_model_dir)
    weight_map["head.weight"] = "model-00009-of-00009.safetensors"
    broken = copy_with_index(tiny_model_dir, tmp_path / "broken", weight_map)
    with CheckpointReader(broken) as reader, pytest.raises(
            CheckpointError, match="model-00009-of-00009.safetensors"):
        reader.validate(tiny_config)


# ---- the conformance generator's checkpoint ----------------------------------------------------
def test_reference_generator_checkpoint_loads_and_validates(
        shared_dir: Path, tmp_path: Path) -> None:
    script = shared_dir / "conformance" / "dsv4-tiny-a" / "make_tiny_checkpoint.py"
    out = tmp_path / "reference"
    subprocess.run([sys.executable, str(script), "--config", "tiny-a", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    config = ModelConfig.from_json_file(out / "config.json")
    with CheckpointReader(out) as reader:
        assert set(reader.names()) == set(expected_tensors(config))
        weights = reader.load_all(config, dtype=torch.bfloat16)
    assert weights["layers.3.ffn.experts.7.w3.weight"].shape == (128, 128)
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())
