"""`--speculative-config` the checkpoint cannot serve is a startup error naming why; any layout
serves it."""
from __future__ import annotations

from pathlib import Path

import pytest

from services.common import cli_args


def parse_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli_args.parse_worker_args(argv, environ={})
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_dspark_on_a_checkpoint_without_dspark_tensors_is_a_startup_error(capsys, tiny_model_dir):
    err = parse_error(capsys, ["--model", str(tiny_model_dir), "--block-size", "32",
                               "--speculative-config", '{"method":"dspark","num_speculative_tokens":7}'])
    assert "no DSpark draft" in err and "--speculative-config method dspark" in err


def test_speculation_on_a_sharded_layout_starts(tiny_model_dir: Path):
    config = cli_args.parse_worker_args(
        ["--model", str(tiny_model_dir), "--dp", "2", "--tp", "2", "--ep", "4",
         "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}'], environ={})
    assert (config.topology.tp, config.topology.ep) == (2, 4)
    assert config.speculative.num_speculative_tokens == 2


def test_mtp_on_the_tiny_checkpoint_starts(tiny_model_dir: Path):
    config = cli_args.parse_worker_args(
        ["--model", str(tiny_model_dir), "--speculative-config",
         '{"method":"mtp","num_speculative_tokens":3}'], environ={})
    assert config.speculative.num_speculative_tokens == 3
