"""Our forward on any device and dtype against DeepSeek's own outputs (the conformance tiny-a golden).

    python -m bench.bench_conformance --conformance ../shared/conformance
                                      [--device cuda --dtype bfloat16] [--variant bf16] [--strict]

The reference checkpoint is written by the conformance folder's own script; every golden prompt runs
through `ModelRuntime` as the golden was made (one prefill → last logits; prefill + 23 single-token
decodes → 24 greedy tokens; the MTP block's logits; fresh state per prompt), and the conformance
checker (`check_logits.py`) decides, against the variant that matches the compute: `fp32` for a
float32 forward (CPU), `bf16` for a bfloat16 one (the CUDA default). Prints the checker's report and
exits with its code. `tests/worker/test_model_parity.py` runs the float32 CPU case in the suite.
"""
from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from services.worker.model.mtp import mtp_logits
from services.worker.model.runtime import ModelRuntime, RuntimeConfig, SequenceChunk

BLOCK_SIZE = 16
NUM_BLOCKS = 32        # 512 positions per sequence: every golden prompt + 24 tokens fits
GREEDY_TOKENS = 24
VARIANT_OF_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}


def write_reference_checkpoint(conformance: Path, out: Path) -> Path:
    """The tiny-a checkpoint, written by the conformance folder's own script (about 3 s)."""
    script = conformance / "dsv4-tiny-a" / "make_tiny_checkpoint.py"
    subprocess.run([sys.executable, str(script), "--config", "tiny-a", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


def reference_runtime(model_dir: Path, dtype: torch.dtype = torch.float32,
                      device: str = "cpu") -> ModelRuntime:
    return ModelRuntime(RuntimeConfig(model_dir=model_dir, dtype=dtype, device=device,
                                      block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS))


@dataclass(frozen=True)
class PromptRun:
    """One golden prompt through the runtime, as the golden was made."""

    logits: torch.Tensor      # the prefill's last-position logits
    greedy: list[int]         # GREEDY_TOKENS greedy tokens (prefill, then single-token decodes)
    mtp: torch.Tensor         # MTP logits for prompt[1:] + [greedy[0]]


def run_prompt(runtime: ModelRuntime, seq_id: int, token_ids: list[int]) -> PromptRun:
    tables = runtime.cache.same_table_for_every_group(list(range(NUM_BLOCKS)))
    out = runtime.step([SequenceChunk(seq_id, 0, token_ids, tables, sample=True)],
                       return_logits=True, return_hidden=True)
    tokens = [out.sampled[0]]
    for i in range(GREEDY_TOKENS - 1):
        pos = len(token_ids) + i
        step = runtime.step([SequenceChunk(seq_id, pos, [tokens[-1]], tables, sample=True)])
        tokens.append(step.sampled[0])
    mtp = mtp_logits(runtime.model, out.hidden[0], token_ids[1:] + [tokens[0]])
    return PromptRun(out.logits[0], tokens, mtp)


def run_prompts(runtime: ModelRuntime, golden: dict) -> dict[str, PromptRun]:
    """Every golden prompt by name, each with fresh state."""
    return {prompt["name"]: run_prompt(runtime, seq_id, prompt["token_ids"])
            for seq_id, prompt in enumerate(golden["prompts"])}


def b64(x: torch.Tensor) -> str:
    return base64.b64encode(x.detach().float().cpu().numpy().astype("<f4").tobytes()).decode()


def candidate_results(runs: dict[str, PromptRun]) -> dict[str, dict]:
    """The checker's `results`."""
    return {name: {"logits_b64": b64(run.logits), "greedy_tokens": run.greedy,
                   "mtp_logits_b64": b64(run.mtp)} for name, run in runs.items()}


def run_checker(conformance: Path, results: dict[str, dict], variant: str, work_dir: Path,
                extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    candidate = work_dir / "candidate.json"
    candidate.write_text(json.dumps({"variant": variant, "results": results}))
    return subprocess.run(
        [sys.executable, str(conformance / "check_logits.py"), str(candidate),
         "--variant", variant, "--report", str(work_dir / "report.json"), *extra],
        capture_output=True, text=True, timeout=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conformance", type=Path, required=True, help="the conformance folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(VARIANT_OF_DTYPE), default="float32")
    parser.add_argument("--variant", default=None, help="golden variant (default: the dtype's)")
    parser.add_argument("--strict", action="store_true", help="the checker's --strict")
    args = parser.parse_args(argv)
    variant = args.variant or VARIANT_OF_DTYPE[args.dtype]
    golden = json.loads((args.conformance / "dsv4-tiny-a" / "golden.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_reference_checkpoint(args.conformance, Path(tmp) / "tiny-a")
        runtime = reference_runtime(model_dir, getattr(torch, args.dtype), args.device)
        results = candidate_results(run_prompts(runtime, golden))
        checker = run_checker(args.conformance, results, variant, Path(tmp),
                              ("--strict",) if args.strict else ())
    print(f"device={args.device} dtype={args.dtype} variant={variant}")
    print(checker.stdout + checker.stderr)
    return checker.returncode


if __name__ == "__main__":
    sys.exit(main())
