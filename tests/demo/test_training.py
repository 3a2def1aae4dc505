"""The training script: a resumed run continues exactly where it stopped, and a run writes its
plots, metrics, evaluation and compact checkpoint next to its state."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from services.demo import export
from services.demo.train_cli import main
from services.demo.trainer import Trainer, TrainSettings

TINY_RUN = TrainSettings(steps=2, examples_per_scene=2)


def test_a_resumed_run_continues_exactly_where_it_stopped(tmp_path: Path) -> None:
    straight = Trainer(tmp_path / "straight", TINY_RUN)
    first = straight.train_step()
    straight.save()
    resumed = Trainer(tmp_path / "straight", TINY_RUN)
    assert resumed.step_index == 1 and resumed.history == [first]
    assert straight.train_step() == resumed.train_step()
    for a, b in zip(straight.params.parameters(), resumed.params.parameters()):
        assert torch.equal(a, b)


def test_a_run_ended_early_writes_plots_metrics_evaluation_and_the_compact_checkpoint(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main([str(out), "--steps", "2", "--stop-after", "1", "--examples-per-scene", "2",
                 "--eval-count", "2", "--heldout-count", "2", "--final-eval-count", "1"]) == 0
    for name in ("loss.png", "accuracy.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 1]
    report = json.loads((out / "final_eval.json").read_text())
    assert set(report["after_quantization"]) == {"exact", "token_accuracy", "mtp_accuracy"}
    assert report["heldout_prompts"] == 1 and report["steps"] == 1
    assert len(json.loads((out / export.HELDOUT_FILE).read_text())) == 2
    assert sorted(p.name for p in (out / "compact").iterdir()) == sorted(export.COMPACT_FILES)
