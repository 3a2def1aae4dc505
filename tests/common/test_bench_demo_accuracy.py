"""The accuracy bench's prompt selection: a validation slice of a longer held-out file."""
import json
from pathlib import Path

import pytest

from bench.bench_demo_accuracy import load_heldout


def _write_prompts(path: Path, count: int) -> Path:
    path.write_text(json.dumps([{"request": {"n": n}, "expected": {}} for n in range(count)]))
    return path


def test_skip_selects_the_prompts_after_the_reported_ones(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "heldout.json", 200)
    picked = load_heldout(100, prompts, skip=100)
    assert [entry["request"]["n"] for entry in picked] == list(range(100, 200))


def test_a_file_too_short_for_the_slice_is_an_error_not_a_smaller_set(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "heldout.json", 150)
    with pytest.raises(SystemExit, match="holds 50 prompts after the first 100, not 100"):
        load_heldout(100, prompts, skip=100)
