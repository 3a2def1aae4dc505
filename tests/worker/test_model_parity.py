"""Reference parity: our float32 forward against the official code's fp32 golden (dsv4-tiny-a).

The reference checkpoint is regenerated with the conformance folder's own script, every golden
prompt is run through `ModelRuntime` exactly as the golden was made (one prefill → last logits;
prefill + 23 single-token decodes → 24 greedy tokens; fresh state per prompt), and the project's
checker decides (`check_logits.py --variant fp32`).
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from bench.bench_conformance import (NUM_BLOCKS, candidate_results, reference_runtime,
                                     run_checker, write_reference_checkpoint)
from services.worker.model.mtp import mtp_logits
from services.worker.model.runtime import ModelRuntime, SequenceChunk


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


def test_fp32_forward_passes_the_reference_checker(runtime: ModelRuntime, golden: dict,
                                                   conformance: Path, tmp_path: Path) -> None:
    gold_npz = np.load(conformance / "dsv4-tiny-a" / "golden_logits.npz")
    gold_results = golden["variants"]["fp32"]["results"]
    results = candidate_results(runtime, golden)
    for prompt in golden["prompts"]:
        ours, gold = results[prompt["name"]], gold_results[prompt["name"]]
        assert int(np.argmax(np.frombuffer(base64.b64decode(ours["logits_b64"]), "<f4"))) \
            == int(np.argmax(gold_npz[gold["prefill"]["npz_key"]])), prompt["name"]
        assert ours["greedy_tokens"] == gold["greedy"]["tokens"], prompt["name"]
    checker = run_checker(conformance, results, "fp32", tmp_path)
    assert checker.returncode == 0, checker.stdout + checker.stderr


def test_mtp_block_matches_the_reference(runtime: ModelRuntime, golden: dict,
                                         conformance: Path) -> None:
    gold_npz = np.load(conformance / "dsv4-tiny-a" / "golden_logits.npz")
    gold_results = golden["variants"]["fp32"]["results"]
    for seq_id, prompt in enumerate(golden["prompts"][:3]):
        tables = runtime.cache.same_table_for_every_group(list(range(NUM_BLOCKS)))
        ids = prompt["token_ids"]
        out = runtime.step([SequenceChunk(100 + seq_id, 0, ids, tables, sample=True)],
                           return_hidden=True)
        mtp = mtp_logits(runtime.model, out.hidden[0], ids[1:] + [out.sampled[0]])
        gold = gold_npz[gold_results[prompt["name"]]["mtp"]["npz_key"]]
        assert float(np.abs(mtp.numpy() - gold).max()) < 1e-3, prompt["name"]
        assert int(mtp.argmax()) == int(np.argmax(gold))
