"""Parallel layouts (DP groups × TP ranks, EP experts) held to the single-rank run and to DeepSeek's
golden, with real rank processes in a gloo world (no services).

Tensor and expert parallelism are exact by construction (see parallel.py and collectives.py); data
parallelism batches other prompts side by side, which moves logits by float rounding only. So
every layout must give the single-rank run's greedy tokens, and its logits at each prompt's last
position within 1e-4.
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.worker.model.layout_run import LayoutRun, Workload, run_layout
from services.worker.model.tiny_checkpoint import write_tiny_checkpoint

PROMPT_LENGTHS = (5, 37, 130, 256, 300, 411, 520, 600)
LOGIT_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def ep16_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-ep16"), preset="tiny-ep16", seed=1)


@pytest.fixture(scope="module")
def workload() -> Workload:
    generator = torch.Generator().manual_seed(0)
    prompts = tuple(tuple(torch.randint(2, 129_000, (n,), generator=generator).tolist())
                    for n in PROMPT_LENGTHS)
    return Workload(prompts, num_new_tokens=24)


@pytest.fixture(scope="module")
def one_rank(ep16_model_dir: Path, workload: Workload) -> LayoutRun:
    return run_layout(ep16_model_dir, 1, 1, 1, workload)


# The guide's dp4 × tp4 × ep16 is held to the single-rank tokens through the real services, two
# workers of eight ranks, in tests/e2e/test_sixteen_ranks_e2e.py (the same workload); here the
# smallest layouts that exercise each split (TP alone; DP, TP and EP together) are held to the
# logits as well.
@pytest.mark.slow  # spawns up to 4 rank processes
@pytest.mark.parametrize("dp, tp, ep", [(1, 2, 2), (2, 2, 4)])
def test_layout_gives_the_single_rank_tokens_and_logits(ep16_model_dir: Path, workload: Workload,
                                                        one_rank: LayoutRun, dp: int, tp: int,
                                                        ep: int) -> None:
    run = run_layout(ep16_model_dir, dp, tp, ep, workload)
    for index in range(len(workload.prompts)):
        mine, reference = run.outputs[index], one_rank.outputs[index]
        assert mine.tokens == reference.tokens, f"prompt {index}"
        for position in (0, -1):  # the prompt's last position, and the last decoded one
            difference = (mine.logits[position] - reference.logits[position]).abs().max()
            assert float(difference) <= LOGIT_TOLERANCE, (index, position, float(difference))


@pytest.mark.slow  # spawns up to 4 rank processes
@pytest.mark.parametrize("dp, tp, ep", [(1, 2, 2), (2, 2, 4)])
def test_conformance_checkpoint_passes_the_reference_checker_when_split(
        shared_dir: Path, tmp_path: Path, dp: int, tp: int, ep: int) -> None:
    conformance = shared_dir / "conformance"
    checkpoint = tmp_path / "dsv4-tiny-a"
    subprocess.run([sys.executable, str(conformance / "dsv4-tiny-a" / "make_tiny_checkpoint.py"),
                    "--config", "tiny-a", "--out", str(checkpoint)],
                   check=True, capture_output=True, timeout=300)
    golden = json.loads((conformance / "dsv4-tiny-a" / "golden.json").read_text())
    prompts = tuple(tuple(p["token_ids"]) for p in golden["prompts"])
    # One chunk per prompt: the golden's prefill logits come from a single prefill.
    run = run_layout(checkpoint, dp, tp, ep, Workload(prompts, num_new_tokens=24,
                                                      chunk_size=max(map(len, prompts))))
    results = {p["name"]: {"logits_b64": _b64(run.outputs[i].logits[0]),
                           "greedy_tokens": run.outputs[i].tokens}
               for i, p in enumerate(golden["prompts"])}
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps({"variant": "fp32", "results": results}))
    checker = subprocess.run([sys.executable, str(conformance / "check_logits.py"),
                              str(candidate), "--variant", "fp32"],
                             capture_output=True, text=True, timeout=300)
    assert checker.returncode == 0, checker.stdout + checker.stderr


def _b64(logits: torch.Tensor) -> str:
    return base64.b64encode(logits.float().numpy().astype("<f4").tobytes()).decode()


@pytest.mark.slow  # spawns 4 rank processes
def test_idle_partitions_write_nothing_and_busy_ones_read_nothing_unwritten(
        ep16_model_dir: Path, workload: Workload, one_rank: LayoutRun) -> None:
    """The seed's review bug: an inactive group mirrored another group's data into live pages.
    Two prompts on four partitions: partitions 2 and 3 have no rows in any step, yet join every
    expert exchange; their caches stay all NaN, and the busy partitions' outputs stay exact."""
    two = Workload(workload.prompts[:2], num_new_tokens=8, poison_caches=True)
    run = run_layout(ep16_model_dir, 4, 1, 4, two)
    assert run.untouched_partitions == {2, 3}
    for index in range(2):
        assert run.outputs[index].tokens == one_rank.outputs[index].tokens[:8]
