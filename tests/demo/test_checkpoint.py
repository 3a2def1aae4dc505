"""The demo checkpoint: training sees exactly the weights the runtime loads after export, the
committed compact form expands into a valid real-format checkpoint, and untrained vocabulary rows
can never win the argmax."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from services.demo import export
from services.demo.encode import SceneEncoder
from services.demo.params import DemoParameters, hash_routing_table, model_tensors, stored_tensors
from services.demo.vocab import tie_structure
from services.worker.model.checkpoint import CheckpointReader, expected_tensors
from services.worker.model.config import ModelConfig
from services.worker.model.tiny_presets import preset_config


@pytest.mark.parametrize("spelt", [False, True])
def test_quantization_aware_training_sees_exactly_the_exported_weights(tmp_path: Path,
                                                                        spelt: bool) -> None:
    config_json = preset_config("tiny-a")
    config = ModelConfig.from_dict(config_json)
    encoder = SceneEncoder()
    # " soup" is a trained spelt token (s + oup), " Kore" an untrained one (K + ore)
    words = "Hello Paris, hello soup" + (" soup Kore" if spelt else "")
    vocab = tie_structure(sorted({0, 1, 128803, 128804} | set(encoder.encode(words))
                                 | set(encoder.encode("soup" if spelt else "Paris"))
                                 | set(encoder.encode("Kore" if spelt else "Paris"))), encoder)
    params = DemoParameters(config, vocab, seed=3, spelt=spelt)
    specs = expected_tensors(config)
    table = hash_routing_table(config, seed=3)
    compact = export.write_compact(tmp_path / "compact", config_json,
                                   stored_tensors(params, vocab, specs, quantized=True),
                                   vocab.ids, table)
    full = export.expand(compact, tmp_path / "full")
    with CheckpointReader(full) as reader:
        served = reader.load_all(config, torch.float32)
    # untrained rows: "hello" reads as " hello" (a stand-in, standins.py), "!" as the mean,
    # " Kore" as the mean or (spelt) as K + ore
    rows = vocab.rows(vocab.outside(encoder.encode("hello! Kore")))
    with torch.no_grad():
        trained = model_tensors(params, vocab, specs, table, quantized=True, rows=rows)
    for name, tensor in trained.items():
        expected = served[name][rows.ids] if name.endswith(("embed.weight", "head.weight",
                                                            "tid2eid")) else served[name]
        assert torch.equal(tensor, expected), name


@pytest.fixture(scope="module")
def committed_vocab() -> dict[str, torch.Tensor]:
    return load_file(str(export.COMPACT_DIR / "vocab.safetensors"))


def test_untrained_rows_never_win_the_argmax(committed_vocab) -> None:
    """Every untrained head row is the mean of the trained rows, so its logit is the mean of the
    trained logits: below the largest one for any hidden state that does not tie them all."""
    ids = committed_vocab["ids"].to(torch.int64)
    head = export.full_rows(export.trained_rows(committed_vocab, "head"), ids, 129280,
                            torch.bfloat16).float()
    untrained = torch.ones(129280, dtype=torch.bool)
    untrained[ids] = False
    generator = torch.Generator().manual_seed(0)
    mean_row = head[untrained][0]
    hidden = torch.cat([torch.randn(2000, head.shape[1], generator=generator) * scale
                        for scale in (0.1, 1.0, 10.0)]
                       + [mean_row[None], -mean_row[None], head[ids[:500]]])
    logits = hidden @ head.T
    best_trained = logits[:, ~untrained].amax(dim=1)
    best_untrained = logits[:, untrained].amax(dim=1)
    assert bool((best_untrained < best_trained).all())


def test_the_default_model_expands_once_into_a_valid_checkpoint(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DSV4SERVE_CACHE", str(tmp_path))
    model_dir = export.default_demo_model_dir()
    stamp = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert export.default_demo_model_dir() == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == stamp
    config = ModelConfig.from_json_file(model_dir / "config.json")
    with CheckpointReader(model_dir) as reader:
        reader.validate(config)
    assert config.vocab_size == 129280 and config.quantization_config is not None
