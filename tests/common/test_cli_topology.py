"""--dp/--tp/--ep/--ranks against the model's config.json: a split it does not allow names the flag
and the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.common import cli_args
from tests.common.cli_helpers import no_default_model, parse_error


class TestTopologyAgainstTheModel:
    @pytest.fixture(scope="class")
    @classmethod
    def ep16_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        from services.worker.model.tiny_presets import preset_config

        out = tmp_path_factory.mktemp("ep16-config")
        (out / "config.json").write_text(json.dumps(preset_config("tiny-ep16")))
        return out

    @pytest.mark.parametrize("argv, message", [
        (["--tp", "3"], "--tp 3 does not divide the model's num_attention_heads (8)"),
        (["--tp", "8"], "--tp 8 does not divide the model's o_groups (4)"),
        (["--dp", "3", "--ep", "3"], "--ep 3 does not divide the model's n_routed_experts (16)"),
    ])
    def test_a_split_the_model_does_not_allow_names_flag_and_field(
            self, capsys: pytest.CaptureFixture[str], ep16_dir: Path, argv: list[str],
            message: str) -> None:
        err = parse_error(capsys, cli_args.parse_worker_args, ["--model", str(ep16_dir), *argv])
        assert message in err

    def test_the_guide_topology_fits_the_ep16_preset(self, ep16_dir: Path) -> None:
        worker = cli_args.parse_worker_args(
            ["--model", str(ep16_dir), "--dp", "4", "--tp", "4", "--ep", "16", "--ranks", "8-15",
             "--dist-init-addr", "10.0.0.1:29500"], environ={}, default_model_dir=no_default_model)
        assert worker.driven_ranks == tuple(range(8, 16)) and not worker.drives_whole_world

    @pytest.mark.parametrize("argv, message", [
        (["--ranks", "8-16", "--dist-init-addr", "h:1"], "--ranks lists rank 16"),
        (["--ranks", "0-7"], "--dist-init-addr HOST:PORT must name the rendezvous"),
    ])
    def test_ranks_outside_the_world_or_without_a_rendezvous_are_refused(
            self, capsys: pytest.CaptureFixture[str], ep16_dir: Path, argv: list[str],
            message: str) -> None:
        err = parse_error(capsys, cli_args.parse_worker_args,
                          ["--model", str(ep16_dir), "--dp", "4", "--tp", "4", "--ep", "16", *argv])
        assert message in err
