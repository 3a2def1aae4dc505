"""The deployment guide's command line and the parse helpers of the flag tests."""
from __future__ import annotations

from pathlib import Path

import pytest

MODEL = Path("/models/dsv4-flash-dspark-w8a8")
DSPARK_K7 = '{"method":"dspark","num_speculative_tokens":7}'

# The deployment guide's command line, minus the program name (NPU-only flags included).
GUIDE_ARGV = [
    "--model", str(MODEL), "--served-model-name", "dsv4-flash-dspark-w8a8",
    "--backend", "cuda", "--platform", "a2a3",
    "--devices", "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "--dp", "4", "--ep", "16", "--tp", "4", "--block-size", "32",
    "--max-model-len", "16384", "--max-num-seqs", "8", "--max-num-batched-tokens", "8192",
    "--long-prefill-token-threshold", "128", "--speculative-config", DSPARK_K7,
    "--enable-prefix-caching", "--ring-heap", "2147483648,2147483648,4294967296,8589934592",
    "--generate-config", '{"max_new_tokens":2048,"temperature":0}',
    "--host", "127.0.0.1", "--port", "8000",
]


def no_default_model() -> Path:
    raise AssertionError("the default model must not be resolved when --model is given or flags are bad")


def parse_error(capsys: pytest.CaptureFixture[str], parse, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(argv, environ={}, default_model_dir=no_default_model)
    assert exc.value.code == 2
    return capsys.readouterr().err
