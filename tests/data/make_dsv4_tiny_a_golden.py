"""Derives `tests/data/dsv4_tiny_a_golden.json` from the conformance golden of dsv4-tiny-a.

The conformance folder (`../shared/conformance/dsv4-tiny-a`, or `$DSV4SERVE_SHARED/conformance/…`)
holds the official DeepSeek-V4-Flash code's outputs on the tiny-a checkpoint; it is not part of a
clone. This keeps a small slice of its `fp32` variant (the one a float32 CPU implementation is
checked against) so `tests/worker/test_model_golden.py` runs everywhere:

- the checkpoint record (sha256 of model.safetensors and config.json) the golden applies to;
- for each of PROMPTS: the prompt ids, the first STEPS greedy tokens with their top1-top2 margins
  and the top-TOP_K (ids, logits) at each step (step 0 is the prefill's last position), and the
  top-TOP_K of the MTP block's last position;
- the fp32 tolerances: `prompt_max_abs` (per-prompt max |Δlogit|) and `margin` (a greedy mismatch at
  a step with a smaller margin is noise).

Prompts: len7 (short, inside the 16-token window), len33 (the window wraps; the indexer starts
choosing among its 8+ ratio-4 entries during decode), len130 (the indexer chooses in prefill, a
ratio-128 entry exists, the prefill remainder goes to the decode state).

    python tests/data/make_dsv4_tiny_a_golden.py [--shared DIR] [--out FILE]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "dsv4_tiny_a_golden.json"
VARIANT = "fp32"
PROMPTS = ("len7", "len33", "len130")
STEPS = 8
TOP_K = 16


def derive(golden_path: Path) -> dict[str, Any]:
    """The committed golden's contents, from the conformance `golden.json`."""
    golden = json.loads(golden_path.read_text())
    variant = golden["variants"][VARIANT]
    tolerances = variant["summary"]["tolerances"]
    prompts = {prompt["name"]: prompt["token_ids"] for prompt in golden["prompts"]}
    return {
        "format": "dsv4serve-tiny-a-golden/1",
        "source": {"file": "conformance/dsv4-tiny-a/golden.json",
                   "sha256": hashlib.sha256(golden_path.read_bytes()).hexdigest(),
                   "variant": VARIANT, "reference": golden["reference"]["code"],
                   "derived_by": "tests/data/make_dsv4_tiny_a_golden.py"},
        "checkpoint": {key: golden["checkpoint"][key] for key in (
            "command", "model.safetensors.sha256", "model.safetensors.bytes",
            "config.json.sha256")},
        "tolerance": {"max_abs_logit": tolerances["prompt_max_abs"],
                      "margin": tolerances["margin"]},
        "prompts": [_prompt(name, prompts[name], variant["results"][name]) for name in PROMPTS],
    }


def _prompt(name: str, token_ids: list[int], result: dict[str, Any]) -> dict[str, Any]:
    greedy = result["greedy"]
    return {
        "name": name,
        "token_ids": token_ids,
        "greedy_tokens": greedy["tokens"][:STEPS],
        "margins": greedy["margins"][:STEPS],
        "step_top_ids": [ids[:TOP_K] for ids in greedy["step_top_ids"][:STEPS]],
        "step_top_values": [values[:TOP_K] for values in greedy["step_top_values"][:STEPS]],
        "mtp_top_ids": result["mtp"]["top_ids"][:TOP_K],
        "mtp_top_values": result["mtp"]["top_values"][:TOP_K],
    }


def find_conformance(shared: Optional[str]) -> Path:
    candidate = Path(shared or os.environ.get("DSV4SERVE_SHARED") or REPO_ROOT.parent / "shared")
    golden = candidate / "conformance" / "dsv4-tiny-a" / "golden.json"
    if not golden.is_file():
        raise SystemExit(f"{golden} not found: pass --shared DIR (the folder holding conformance/)")
    return golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", help="folder holding conformance/ (default: $DSV4SERVE_SHARED "
                                         "or ../shared beside the repository)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    data = derive(find_conformance(args.shared))
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
