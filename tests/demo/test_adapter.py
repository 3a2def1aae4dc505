"""Training runs the runtime's own forward: the adapter's scene computation (shared prefix,
continuations, chunked calls, MTP) gives the values the serving runtime computes, and gradients
reach the checkpoint tensors through it."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from services.demo.adapter import run_scene, shared_length
from services.worker.model.checkpoint import CheckpointReader
from services.worker.model.config import ModelConfig
from services.worker.model.mtp import mtp_logits
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk
from services.worker.model.transformer import DeepseekV4
from services.worker.model.weights import ModelWeights

BLOCKS = 32


@pytest.fixture(scope="module")
def runtime(tiny_model_dir: Path) -> ModelRuntime:
    return ModelRuntime(RuntimeConfig(tiny_model_dir, torch.float32, "cpu", 32, BLOCKS))


@pytest.fixture(scope="module")
def scene() -> tuple[list[int], list[list[int]]]:
    rng = random.Random(0)
    prefix = [0] + [rng.randrange(100, 5000) for _ in range(150)]
    # The second continuation crosses position 256, so the HCA layer (ratio 128) completes an entry
    # outside the prefix (which is computed without gradient).
    return prefix, [prefix + [rng.randrange(100, 5000) for _ in range(n)] for n in (20, 140)]


def test_scene_hidden_and_mtp_equal_the_serving_runtime(runtime: ModelRuntime, scene) -> None:
    prefix, sequences = scene
    with torch.no_grad():
        out = run_scene(runtime.model, prefix, sequences)
    shared = shared_length(len(prefix))
    assert out.start_pos == shared
    for k, sequence in enumerate(sequences):
        tables = runtime.cache.same_table_for_every_group(list(range(BLOCKS)))
        served = runtime.step([SequenceChunk(100 + k, 0, sequence, tables, sample=False)],
                              return_hidden=True).hidden[0]
        torch.testing.assert_close(out.hidden[k], served[shared:], rtol=1e-5, atol=1e-5)
        served_mtp = mtp_logits(runtime.model, served, sequence[1:] + [1])
        mine = runtime.model.logits(out.mtp_hidden[k][-1:], prefix="mtp.0.")[0]
        torch.testing.assert_close(mine, served_mtp, rtol=1e-5, atol=1e-5)


def test_gradients_reach_every_trainable_tensor_through_the_runtime_code(tiny_model_dir: Path,
                                                                          scene) -> None:
    config = ModelConfig.from_json_file(tiny_model_dir / "config.json")
    with CheckpointReader(tiny_model_dir) as reader:
        tensors = reader.load_all(config, torch.float32)
    leaves = {n: t.requires_grad_(True) for n, t in tensors.items() if t.is_floating_point()}
    model = DeepseekV4(config, ModelWeights(tensors, torch.float32, "cpu"))
    prefix, sequences = scene
    out = run_scene(model, prefix, sequences)
    loss = sum(model.logits(h).logsumexp(-1).mean() for h in out.hidden)
    loss = loss + sum(model.logits(h, "mtp.0.").logsumexp(-1).mean() for h in out.mtp_hidden)
    loss.backward()
    # The indexer only chooses entries (top-k) and the gate bias only chooses experts: neither
    # has a gradient, in training code as in DeepSeek's.
    untrainable = ("indexer.", "gate.bias")
    missing = [n for n, t in leaves.items() if t.grad is None and not any(u in n for u in untrainable)]
    assert not missing, missing
