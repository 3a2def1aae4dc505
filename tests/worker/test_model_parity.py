"""Reference parity: our float32 forward against the official code's fp32 golden (dsv4-tiny-a).

The reference checkpoint is regenerated with the conformance folder's own script, every golden
prompt is run through `ModelRuntime` exactly as the golden was made (one prefill → last logits;
prefill + 23 single-token decodes → 24 greedy tokens; fresh state per prompt), and the project's
checker decides (`check_logits.py --variant fp32`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.bench_conformance import (PromptRun, candidate_results, reference_runtime, run_checker,
                                     run_prompts, write_reference_checkpoint)
from services.worker.model.runtime import ModelRuntime


@pytest.fixture(scope="module")
def conformance(shared_dir: Path) -> Path:
    return shared_dir / "conformance"


@pytest.fixture(scope="module")
def reference_checkpoint(conformance: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reference_checkpoint(conformance, tmp_path_factory.mktemp("dsv4-tiny-a-ref"))


@pytest.fixture(scope="module")
def runtime(reference_checkpoint: Path) -> ModelRuntime:
    return reference_runtime(reference_checkpoint)


@pytest.fixture(scope="module")
def golden(conformance: Path) -> dict:
    return json.loads((conformance / "dsv4-tiny-a" / "golden.json").read_text())


@pytest.fixture(scope="module")
def runs(runtime: ModelRuntime, golden: dict) -> dict[str, PromptRun]:
    return run_prompts(runtime, golden)


def test_fp32_forward_passes_the_reference_checker(runs: dict[str, PromptRun], golden: dict,
                                                   conformance: Path, tmp_path: Path) -> None:
    gold_npz = np.load(conformance / "dsv4-tiny-a" / "golden_logits.npz")
    gold_results = golden["variants"]["fp32"]["results"]
    for name, run in runs.items():
        gold = gold_results[name]
        assert int(run.logits.argmax()) == int(np.argmax(gold_npz[gold["prefill"]["npz_key"]])), name
        assert run.greedy == gold["greedy"]["tokens"], name
    checker = run_checker(conformance, candidate_results(runs), "fp32", tmp_path)
    assert checker.returncode == 0, checker.stdout + checker.stderr


def test_mtp_block_matches_the_reference(runs: dict[str, PromptRun], golden: dict,
                                         conformance: Path) -> None:
    gold_npz = np.load(conformance / "dsv4-tiny-a" / "golden_logits.npz")
    gold_results = golden["variants"]["fp32"]["results"]
    for prompt in golden["prompts"][:3]:
        mtp = runs[prompt["name"]].mtp
        gold = gold_npz[gold_results[prompt["name"]]["mtp"]["npz_key"]]
        assert float(np.abs(mtp.numpy() - gold).max()) < 1e-3, prompt["name"]
        assert int(mtp.argmax()) == int(np.argmax(gold))
