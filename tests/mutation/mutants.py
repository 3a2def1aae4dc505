"""Planted-bug check: does a fast test fail for each plausible bug, with and without ../shared?

Each mutant is a text patch (exact `old` → `new` snippets, each `old` found exactly once) applied to
a temporary copy of the working tree (tracked and untracked, non-ignored files); the mutant's named
tests then run in that copy with `-m "not slow"` (slow ones too where the mutant says so). A mutant is CAUGHT when a test fails, MISSED when
they all pass (or skip), STALE when its anchor text is no longer in the file (update the mutant), and
ERROR on any other pytest outcome. Before any mutant, the unmutated copy must pass the same tests.

`../shared` is "absent" in the copy (its parent holds no `shared/`, DSV4SERVE_SHARED unset) and
"present" with DSV4SERVE_SHARED pointing at the reference folder, so both columns are real.

    .venv/bin/python tests/mutation/mutants.py                 # every mutant, shared present + absent
    .venv/bin/python tests/mutation/mutants.py --only sink --shared absent
    .venv/bin/python tests/mutation/mutants.py --list

Add a mutant to MUTANTS to check the tests of new code; this file is not collected by pytest.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 1800
MODEL_TESTS = ("tests/worker/test_model_golden.py", "tests/worker/test_model_parity.py",
               "tests/worker/test_model_invariance.py")
CONSTRAINT_TESTS = ("tests/frontend/test_constraints.py", "tests/frontend/test_constraints_nested.py",
                    "tests/scheduler/test_grammar_nested.py", "tests/scheduler/test_grammar.py")
SAMPLING_TESTS = ("tests/worker/test_sampling.py", "tests/worker/test_masked_argmax.py",
                  "tests/worker_service/test_executor.py")
PREFIX_TESTS = ("tests/scheduler/test_block_pool.py", "tests/scheduler/test_prefix_caching.py")
LAYOUT_TESTS = ("tests/worker/test_parallel_layouts.py::test_layout_gives_the_single_rank_tokens_and_logits",)
RESUME_TESTS = ("tests/worker/test_prefix_resume.py", "tests/worker/test_paging.py")


@dataclass(frozen=True)
class Mutant:
    id: str
    description: str
    path: str
    hunks: tuple[tuple[str, str], ...]   # (old, new); each old occurs exactly once in path
    tests: tuple[str, ...]
    include_slow: bool = False           # run the tests marked slow too (multi-process layouts)


BOOLEANS_TO_EMPTY = '''

def _booleans_to_empty(node):
    """MUTANT: boolean sub-schemas become {} (nested additionalProperties: false is lost)."""
    if isinstance(node, bool):
        return {}
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in ("items", "additionalProperties", "unevaluatedProperties"):
        if key in out:
            out[key] = _booleans_to_empty(out[key])
    for key in ("properties", "$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {k: _booleans_to_empty(v) for k, v in out[key].items()}
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [_booleans_to_empty(v) for v in out[key]]
    return out
'''

MUTANTS = (
    Mutant("bitmask-bit-shift", "bitmask bit test shifted by one in _refused",
           "services/worker/model/sampling.py",
           (("return ((word >> (tokens & 31)) & 1) == 0",
             "return ((word >> ((tokens & 31) + 1)) & 1) == 0"),),
           SAMPLING_TESTS),
    Mutant("nested-bool-subschemas", "boolean sub-schemas of JSON parameters rewritten to {}",
           "services/frontend/constraints.py",
           (("            document.setdefault(keyword, definitions)\n",
             "            document.setdefault(keyword, definitions)\n"
             "        document = _booleans_to_empty(document)\n"),
            ("\n\ndef _is_raw_string(", BOOLEANS_TO_EMPTY + "\n\ndef _is_raw_string(")),
           CONSTRAINT_TESTS),
    Mutant("openness-overrides-closed", "explicit openness also overwrites a stated "
           "additionalProperties", "services/frontend/schema_openness.py",
           (('if "properties" in out and not {"additionalProperties", "unevaluatedProperties"} '
             '& out.keys():', 'if "properties" in out:'),),
           CONSTRAINT_TESTS),
    Mutant("sink", "attention sink left out of the softmax", "services/worker/model/attention.py",
           (("lse = torch.logsumexp(torch.cat([scores, sink_col], dim=-1), dim=-1, keepdim=True)",
             "lse = torch.logsumexp(scores, dim=-1, keepdim=True)"),),
           MODEL_TESTS),
    Mutant("indexer-topk", "indexer keeps top-(k-1) entries", "services/worker/model/attention.py",
           (("topk = self.config.index_topk\n", "topk = self.config.index_topk - 1\n"),),
           MODEL_TESTS),
    Mutant("routing-bias-in-weights", "gate bias leaks into the expert weights",
           "services/worker/model/moe.py",
           (("experts = biased.topk(config.num_experts_per_tok, dim=-1).indices\n",
             "experts = biased.topk(config.num_experts_per_tok, dim=-1).indices\n"
             "        scores = biased\n"),),
           MODEL_TESTS),
    Mutant("publish-unconfirmed", "blocks published when scheduled, before the worker confirmed them",
           "services/scheduler/step_rows.py",
           (("    unsent = kv.take_unsent(seq_id)\n",
             "    unsent = kv.take_unsent(seq_id)\n"
             "    kv.publish(seq_id, request.block_hashes, end)\n"),),
           PREFIX_TESTS),
    Mutant("hash-ignores-parent", "a block's hash covers its own tokens only, not the prefix",
           "services/scheduler/prefix_cache.py",
           (("return hashlib.sha256(parent + np.asarray(",
             "return hashlib.sha256(np.asarray("),),
           PREFIX_TESTS),
    Mutant("hit-skips-window-block", "a hit shares a windowed group's blocks from one block late",
           "services/scheduler/kv_cache.py",
           (("            first[group.name] = first_needed_block(group.sliding_window, k * self.block_size,\n"
             "                                                   self.block_size)\n",
             "            first[group.name] = first_needed_block(group.sliding_window, k * self.block_size,\n"
             "                                                   self.block_size) + (group.sliding_window > 0)\n"),),
           PREFIX_TESTS),
    Mutant("hit-leaves-nothing", "a hit may cover the whole prompt (no token left to compute)",
           "services/scheduler/prefix_cache.py",
           (("max_blocks = (request.num_tokens - self.policy.min_tokens_to_compute) // self.kv.block_size",
             "max_blocks = request.num_tokens // self.kv.block_size"),),
           PREFIX_TESTS),
    Mutant("replay-forgets-output", "a replayed constrained request's fresh matcher skips its output",
           "services/scheduler/memory_pressure.py",
           (("for position, token in enumerate(request.output_token_ids):",
             "for position, token in enumerate(request.output_token_ids[:0]):"),),
           PREFIX_TESTS),
    Mutant("csa-window-without-overlap", "ratio-4 compressor rows kept 4 tokens, not 8 (the "
           "overlapped block before is released)", "services/worker/model/kv_cache.py",
           (("STATE_WINDOWS = {4: 8, 128: 128}", "STATE_WINDOWS = {4: 4, 128: 128}"),),
           RESUME_TESTS),
    Mutant("entries-by-first-token", "compressed entries stored in their first token's block "
           "(a later step writes into a shared block)", "services/worker/model/kv_cache.py",
           (("last_tokens = (torch.arange(count, device=block_table.device) + first_entry + 1) * ratio - 1",
             "last_tokens = (torch.arange(count, device=block_table.device) + first_entry) * ratio"),),
           RESUME_TESTS),
    Mutant("ep-output-offset", "a TP rank that did not contribute its group's tokens reads the "
           "reduced expert outputs at its own EP index, not its contributor's",
           "services/worker/model/collectives.py",
           (("        self._own_offset = sum(self._counts[:contributor_index])\n",
             "        self._own_offset = sum(self._counts[:layout.ep_rank])\n"),),
           LAYOUT_TESTS, include_slow=True),
    Mutant("tp-concat-order", "TP all-gather pieces concatenated in reverse rank order",
           "services/worker/model/collectives.py",
           (("        return torch.cat(pieces, dim=-1).to(x.dtype)\n",
             "        return torch.cat(pieces[::-1], dim=-1).to(x.dtype)\n"),),
           LAYOUT_TESTS, include_slow=True),
    Mutant("generator-drift", "tiny checkpoint generator seeded differently",
           "services/worker/model/tiny_checkpoint.py",
           (("    generator.manual_seed(seed)\n", "    generator.manual_seed(seed + 1)\n"),),
           ("tests/worker/test_model_golden.py",)),
)


def copy_tree(destination: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO_ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO_ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def scratch_env(copy: Path, shared: Optional[Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DSV4SERVE_SHARED", "PYTHONPATH")}
    env["PYTHONPATH"] = str(copy)     # the copy's services/, not the editable install's
    if shared is not None:
        env["DSV4SERVE_SHARED"] = str(shared)
    return env


def run_tests(copy: Path, tests: tuple[str, ...], env: dict[str, str],
              include_slow: bool) -> tuple[int, str]:
    markers = [] if include_slow else ["-m", "not slow"]
    command = [sys.executable, "-m", "pytest", "-q", "-x", *markers, "-rfE",
               "-p", "no:cacheprovider", *tests]
    done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    return done.returncode, done.stdout + done.stderr


def apply(copy: Path, mutant: Mutant) -> Optional[str]:
    """Patches the copy; returns the original text, or None when an anchor is missing."""
    path = copy / mutant.path
    if not path.is_file():
        return None
    original = text = path.read_text(encoding="utf-8")
    for old, new in mutant.hunks:
        if text.count(old) != 1:
            return None
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    return original


def verdict(returncode: int, output: str) -> str:
    if returncode == 0:
        return "MISSED"
    if returncode == 1:
        failed = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
        return "caught" + (f" by {failed.group(1)}" if failed else "")
    return f"ERROR (pytest exit {returncode})"


def check_mode(mutants: list[Mutant], shared: Optional[Path], label: str) -> dict[str, str]:
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        copy = Path(scratch) / "repo"      # no shared/ beside it
        copy_tree(copy)
        env = scratch_env(copy, shared)
        where = subprocess.run([sys.executable, "-c", "import services; print(services.__file__)"],
                               cwd=copy, env=env, capture_output=True, text=True).stdout
        if not where.startswith(str(copy)):
            raise SystemExit(f"the copy imports services from {where.strip()!r}, not {copy}")
        tests = tuple(dict.fromkeys(t for mutant in mutants for t in mutant.tests))
        returncode, output = run_tests(copy, tests, env, any(m.include_slow for m in mutants))
        if returncode != 0:
            raise SystemExit(f"baseline ({label}) does not pass; fix that first:\n{output[-3000:]}")
        results = {}
        for mutant in mutants:
            original = apply(copy, mutant)
            if original is None:
                results[mutant.id] = "STALE (anchor text not found)"
                continue
            try:
                results[mutant.id] = verdict(*run_tests(copy, mutant.tests, env, mutant.include_slow))
            finally:
                (copy / mutant.path).write_text(original, encoding="utf-8")
            print(f"  [{label}] {mutant.id}: {results[mutant.id]}", flush=True)
        return results


def find_shared(explicit: Optional[str]) -> Path:
    for candidate in (explicit, os.environ.get("DSV4SERVE_SHARED"), REPO_ROOT.parent / "shared"):
        if candidate and (Path(candidate) / "conformance").is_dir():
            return Path(candidate)
    raise SystemExit("../shared not found: pass --shared-dir DIR (the folder holding conformance/)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", help="mutant id (repeatable)")
    parser.add_argument("--shared", choices=("both", "present", "absent"), default="both")
    parser.add_argument("--shared-dir", help="the reference folder holding conformance/")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if not args.only or m.id in args.only]
    if args.list or not mutants:
        for mutant in MUTANTS:
            print(f"{mutant.id:28s} {mutant.path}: {mutant.description}")
        return 0 if args.list else 2
    columns = {}
    for mode in ("present", "absent") if args.shared == "both" else (args.shared,):
        shared = find_shared(args.shared_dir) if mode == "present" else None
        columns[mode] = check_mode(mutants, shared, f"shared {mode}")
    print("\n| mutant | " + " | ".join(f"../shared {mode}" for mode in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for mutant in mutants:
        print(f"| {mutant.id} | " + " | ".join(columns[mode][mutant.id] for mode in columns) + " |")
    missed = [r for column in columns.values() for r in column.values() if not r.startswith("caught")]
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
