"""bench/serve.py against the real stack: a tiny concurrency sweep writes its JSON and PNG."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO_ROOT, RunningStack

pytestmark = pytest.mark.slow

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_serve_bench_sweeps_concurrency_and_writes_figures(stack: RunningStack, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    command = [sys.executable, "bench/serve.py", "--base-url", stack.base_url,
               "--concurrency", "1,2", "--num-prompts", "2", "--constrained-share", "0.5",
               "--prompt-len", "8", "--output-len", "12", "--output-len-range", "0",
               "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "concurrency 2: 100%" in done.stderr           # the progress bar ran to the end
    assert "TTFT" in done.stdout and "ITL constrained" in done.stdout

    result = json.loads(out.with_suffix(".json").read_text())
    assert result["model"] == stack.served_model_name and result["swept"] == "concurrency"
    assert [level["value"] for level in result["levels"]] == [1, 2]
    for level in result["levels"]:
        figures, requests = level["figures"], level["requests"]
        assert figures["completed"] == figures["requests"] == 2 and figures["errors"] == {}
        assert sorted(r["constrained"] for r in requests) == [False, True]
        assert figures["output_tokens"] == sum(r["output_tokens"] for r in requests) > 0
        assert all(0 < r["output_tokens"] <= 12 for r in requests)
        for percentile in ("p50", "p90", "p99"):
            assert figures["ttft_ms"][percentile] > 0 and figures["itl_ms"][percentile] > 0
        plain = next(r for r in requests if not r["constrained"])
        assert plain["ttft_s"] == plain["chunk_times_s"][0] <= plain["latency_s"]
    assert png_size(out.with_suffix(".png")) == (1100, 420)
