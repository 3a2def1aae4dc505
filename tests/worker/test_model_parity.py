"""Reference parity: our float32 forward against the official code's fp32 golden (dsv4-tiny-a).

The reference checkpoint is regenerated with the conformance folder's own script, every golden
prompt is run through `ModelRuntime` exactly as the golden was made (one prefill → last logits;
prefill + 23 single-token decodes → 24 greedy tokens; fresh state per prompt), and the project's
checker decides (`check_logits.py --variant fp32`).
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from services.worker.model.mtp import mtp_logits
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk

BLOCK_SIZE = 16
NUM_BLOCKS = 32        # 512 positions per sequence: every golden prompt + 24 tokens fits
GREEDY_TOKENS = 24


@pytest.fixture(scope="module")
def conformance(shared_dir: Path) -> Path:
    return shared_dir / "conformance"


@pytest.fixture(scope="module")
def reference_checkpoint(conformance: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dsv4-tiny-a-ref")
    script = conformance / "dsv4-tiny-a" / "make_tiny_checkpoint.py"
    subprocess.run([sys.executable, str(script), "--config", "tiny-a", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def runtime(reference_checkpoint: Path) -> ModelRuntime:
    return ModelRuntime(RuntimeConfig(model_dir=reference_checkpoint, dtype=torch.float32,
                                      device="cpu", block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))


@pytest.fixture(scope="module")
def golden(conformance: Path) -> dict:
    return json.loads((conformance / "dsv4-tiny-a" / "golden.json").read_text())


def run_prompt(runtime: ModelRuntime, seq_id: int, token_ids: list[int]
               ) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """→ (prefill last logits, greedy tokens, MTP logits for prompt[1:] + [greedy[0]])."""
    tables = runtime.cache.same_table_for_every_group(list(range(NUM_BLOCKS)))
    out = runtime.step([SequenceChunk(seq_id, 0, token_ids, tables, sample=True)],
                       return_logits=True, return_hidden=True)
    prefill_logits, hidden = out.logits[0], out.hidden[0]
    tokens = [out.sampled[0]]
    for i in range(GREEDY_TOKENS - 1):
        pos = len(token_ids) + i
        step = runtime.step([SequenceChunk(seq_id, pos, [tokens[-1]], tables, sample=True)])
        tokens.append(step.sampled[0])
    mtp = mtp_logits(runtime.model, hidden, token_ids[1:] + [tokens[0]])
    return prefill_logits, tokens, mtp


def b64(x: torch.Tensor) -> str:
    return base64.b64encode(x.float().numpy().astype("<f4").tobytes()).decode()


def test_fp32_forward_passes_the_reference_checker(runtime: ModelRuntime, golden: dict,
                                                   conformance: Path, tmp_path: Path) -> None:
    gold_npz = np.load(conformance / "dsv4-tiny-a" / "golden_logits.npz")
    gold_results = golden["variants"]["fp32"]["results"]
    results = {}
    for seq_id, prompt in enumerate(golden["prompts"]):
        logits, tokens, mtp = run_prompt(runtime, seq_id, prompt["token_ids"])
        gold = gold_npz[gold_results[prompt["name"]]["prefill"]["npz_key"]]
        assert int(logits.argmax()) == int(np.argmax(gold)), prompt["name"]
        assert tokens == gold_results[prompt["name"]]["greedy"]["tokens"], prompt["name"]
        results[prompt["name"]] = {"logits_b64": b64(logits), "greedy_tokens": tokens,
                                   "mtp_logits_b64": b64(mtp)}
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps({"variant": "fp32", "results": results}))
    report = tmp_path / "report.json"
    checker = subprocess.run(
        [sys.executable, str(conformance / "check_logits.py"), str(candidate),
         "--variant", "fp32", "--report", str(report)],
        capture_output=True, text=True, timeout=300)
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
