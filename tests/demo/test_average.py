"""Averaging runs: the averaged model's weights are the mean of the runs' master weights, it is
evaluated and exported like a finished run, and runs that cannot be averaged are refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from services.demo import export
from services.demo.average_cli import averaged_state, main
from services.demo.trainer import STATE_FILE, Trainer, TrainSettings

TINY_RUN = TrainSettings(steps=2, examples_per_scene=2)


def _run(out: Path, seed_offset: int, steps: int = 1) -> Path:
    """A tiny run of `steps` steps whose weights are moved apart from its twin's."""
    trainer = Trainer(out, TINY_RUN)
    for _ in range(steps):
        trainer.train_step()
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed_offset)
        for parameter in trainer.params.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 1e-3)
    trainer.save()
    return out


def test_the_averaged_model_is_the_mean_of_the_runs_and_is_exported_with_its_sources(
        tmp_path: Path) -> None:
    runs = [_run(tmp_path / "a", 1), _run(tmp_path / "b", 2)]
    out = tmp_path / "mean"
    assert main([str(out), *map(str, runs), "--eval-count", "2", "--heldout-count", "2",
                 "--final-eval-count", "1"]) == 0
    states = [torch.load(run / STATE_FILE, weights_only=False) for run in runs]
    averaged = Trainer(out, TINY_RUN)
    for key, value in averaged.params.state_dict().items():
        assert torch.allclose(value, (states[0]["params"][key] + states[1]["params"][key]) / 2)
    assert averaged.step_index == 1 and averaged.history[-1]["averaged"]
    record = json.loads((out / "compact" / export.TRAINING_FILE).read_text())
    assert [source["run"] for source in record["averaged_from"]] == ["a", "b"]
    assert export.read_training(out / "compact")[1] == 1
    for name in ("loss.png", "accuracy.png", "final_eval.json", export.HELDOUT_FILE):
        assert (out / name).is_file()


def test_runs_stopped_at_different_steps_are_refused(tmp_path: Path) -> None:
    states = [torch.load(_run(tmp_path / "a", 1) / STATE_FILE, weights_only=False),
              torch.load(_run(tmp_path / "b", 2, steps=2) / STATE_FILE, weights_only=False)]
    with pytest.raises(ValueError, match="b: its step differs"):
        averaged_state(states, ["a", "b"])
    assert main([str(tmp_path / "mean"), str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert not (tmp_path / "mean").exists()
