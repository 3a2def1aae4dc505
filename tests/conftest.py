"""Fixtures shared by every test package.

`shared_dir` finds the project's reference material (`../shared` beside the repository, or
`$DSV4SERVE_SHARED`). Tests that need it skip with a clear message when it is absent, so a fresh clone
elsewhere still passes; CI has it.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def find_shared_dir() -> Path | None:
    candidates = [os.environ.get("DSV4SERVE_SHARED"), REPO_ROOT.parent / "shared"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "conformance").is_dir():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    found = find_shared_dir()
    if found is None:
        pytest.skip("../shared (reference conformance data) is not present beside this checkout; "
                    "set DSV4SERVE_SHARED to run reference tests")
    return found


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's own default model: the tiny random checkpoint in the real V4 format."""
    from services.worker.model.tiny_checkpoint import write_tiny_checkpoint

    out = tmp_path_factory.mktemp("tiny-a")
    write_tiny_checkpoint(out, preset="tiny-a", seed=1)
    return out
