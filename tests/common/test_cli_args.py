"""Operators' flags → config objects: the guide's command line works, mistakes name their flag."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from services.common import cli_args
from services.common.config import GenerateDefaults, SpeculativeConfig
from tests.common.cli_helpers import DSPARK_K7, GUIDE_ARGV, MODEL, no_default_model, parse_error


class TestGuideCommandLine:
    def test_guide_flags_build_the_canonical_dspark_stack(self) -> None:
        stack = cli_args.parse_stack_args(GUIDE_ARGV, environ={}, default_model_dir=no_default_model)

        topology = stack.worker.topology
        assert (topology.backend, topology.dp, topology.tp, topology.ep) == ("cuda", 4, 4, 16)
        assert topology.devices == tuple(range(16))
        assert stack.worker.speculative == SpeculativeConfig("dspark", 7)
        assert stack.scheduler.speculative == SpeculativeConfig("dspark", 7)
        assert stack.scheduler.served_model_name == "dsv4-flash-dspark-w8a8"
        assert stack.frontend.served_model_name == "dsv4-flash-dspark-w8a8"
        assert (stack.scheduler.max_num_seqs, stack.scheduler.max_num_batched_tokens) == (8, 8192)
        assert stack.worker.max_num_seqs == 8  # a DSpark worker sizes its windows for as many
        assert stack.scheduler.long_prefill_token_threshold == 128
        assert stack.scheduler.enable_prefix_caching is True
        assert stack.frontend.generate_defaults == GenerateDefaults(max_new_tokens=2048, temperature=0.0)
        assert (stack.frontend.host, stack.frontend.port) == ("127.0.0.1", 8000)

    def test_internal_services_are_wired_to_each_other(self) -> None:
        stack = cli_args.parse_stack_args(
            ["--model", str(MODEL), "--scheduler-port", "6001", "--worker-port", "6002"],
            environ={}, default_model_dir=no_default_model)

        assert stack.worker.port == 6002
        assert stack.scheduler.worker_addresses == ("127.0.0.1:6002",)
        assert stack.scheduler.port == 6001
        assert stack.frontend.scheduler_address == "127.0.0.1:6001"

    def test_npu_only_settings_are_named_in_warnings(self, caplog: pytest.LogCaptureFixture) -> None:
        with caplog.at_level(logging.WARNING, logger="services.common.cli_args"):
            cli_args.parse_stack_args(GUIDE_ARGV, environ={"PYPTO_CACHE": "1", "PYPTO_CACHE_DIR": "/c", "HOME": "/"},
                                      default_model_dir=no_default_model)

        text = caplog.text
        for name in ("--platform a2a3", "--ring-heap", "PYPTO_CACHE", "PYPTO_CACHE_DIR"):
            assert name in text
        assert "HOME" not in text

    def test_no_warning_without_npu_settings(self, caplog: pytest.LogCaptureFixture) -> None:
        with caplog.at_level(logging.WARNING, logger="services.common.cli_args"):
            cli_args.parse_worker_args(["--model", str(MODEL)], environ={}, default_model_dir=no_default_model)
        assert caplog.text == ""


class TestStartupErrorsNameTheFlag:
    def test_backend_npu_is_a_clear_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = parse_error(capsys, cli_args.parse_stack_args, ["--backend", "npu"])
        assert "--backend npu is not supported" in err

    def test_unknown_backend_is_rejected(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = parse_error(capsys, cli_args.parse_worker_args, ["--backend", "tpu"])
        assert "--backend tpu" in err

    def test_dspark_needs_ep_equal_to_world(self, capsys: pytest.CaptureFixture[str]) -> None:
        argv = ["--dp", "2", "--tp", "2", "--ep", "2", "--speculative-config", DSPARK_K7]
        err = parse_error(capsys, cli_args.parse_worker_args, argv)
        assert "--ep 2" in err and "= 4" in err

    def test_dspark_accepts_dp_tp_with_ep_equal_to_world(self) -> None:
        argv = ["--model", str(MODEL), "--dp", "2", "--tp", "2", "--ep", "4", "--speculative-config",
                '{"method":"dspark","num_speculative_tokens":0}']
        worker = cli_args.parse_worker_args(argv, environ={}, default_model_dir=no_default_model)
        assert worker.topology.world_size == 4

    def test_mtp_speculation_is_accepted_with_k_in_range(self) -> None:
        argv = ["--model", str(MODEL), "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}']
        worker = cli_args.parse_worker_args(argv, environ={}, default_model_dir=no_default_model)
        assert worker.speculative == SpeculativeConfig("mtp", 3)

    @pytest.mark.parametrize("spec", ['{"method":"mtp","num_speculative_tokens":8}',
                                      '{"method":"dspark","num_speculative_tokens":16}',
                                      '{"method":"mtp","num_speculative_tokens":-1}'])
    def test_k_out_of_range_is_a_startup_error(self, capsys: pytest.CaptureFixture[str], spec: str) -> None:
        err = parse_error(capsys, cli_args.parse_worker_args, ["--speculative-config", spec])
        assert "argument --speculative-config" in err and "num_speculative_tokens" in err

    def test_dspark_needs_block_size_32(self, capsys: pytest.CaptureFixture[str]) -> None:
        argv = ["--block-size", "16", "--speculative-config", DSPARK_K7]
        assert "--block-size 16" in parse_error(capsys, cli_args.parse_scheduler_args, argv)
        assert "--block-size 16" in parse_error(capsys, cli_args.parse_stack_args, argv)

    def test_block_size_is_free_without_dspark(self) -> None:
        worker = cli_args.parse_worker_args(["--model", str(MODEL), "--block-size", "16"],
                                            environ={}, default_model_dir=no_default_model)
        assert worker.block_size == 16

    def test_cuda_devices_must_match_ranks(self, capsys: pytest.CaptureFixture[str]) -> None:
        argv = ["--backend", "cuda", "--dp", "2", "--tp", "2", "--ep", "4", "--devices", "0,1"]
        err = parse_error(capsys, cli_args.parse_stack_args, argv)
        assert "--devices lists 2" in err and "4 ranks" in err

    def test_ep_must_divide_world(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = parse_error(capsys, cli_args.parse_worker_args, ["--dp", "2", "--ep", "3"])
        assert "--ep 3" in err

    @pytest.mark.parametrize("flag", ["--speculative-config", "--generate-config"])
    def test_bad_json_names_the_flag(self, capsys: pytest.CaptureFixture[str], flag: str) -> None:
        err = parse_error(capsys, cli_args.parse_stack_args, [flag, "{method: dspark"])
        assert f"argument {flag}: invalid JSON" in err

    def test_unknown_speculative_method_is_rejected(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = parse_error(capsys, cli_args.parse_worker_args,
                          ["--speculative-config", '{"method":"eagle","num_speculative_tokens":3}'])
        assert "argument --speculative-config" in err and "eagle" in err

    def test_non_greedy_default_temperature_is_rejected(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = parse_error(capsys, cli_args.parse_frontend_args, ["--generate-config", '{"temperature":0.7}'])
        assert "argument --generate-config" in err and "greedy" in err

    def test_unknown_generate_config_key_is_rejected(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = parse_error(capsys, cli_args.parse_scheduler_args, ["--generate-config", '{"top_k":5}'])
        assert "argument --generate-config" in err and "top_k" in err

    @pytest.mark.parametrize("flag", ["--dp", "--max-model-len", "--max-num-seqs", "--block-size"])
    def test_sizes_must_be_positive(self, capsys: pytest.CaptureFixture[str], flag: str) -> None:
        err = parse_error(capsys, cli_args.parse_stack_args, [flag, "0"])
        assert f"argument {flag}: must be a positive integer" in err

    def test_worker_addresses_need_a_port(self, capsys: pytest.CaptureFixture[str]) -> None:
        err = parse_error(capsys, cli_args.parse_scheduler_args, ["--workers", "10.0.0.1:50061,10.0.0.2"])
        assert "argument --workers" in err and "10.0.0.2" in err


class TestDefaults:
    def test_missing_model_uses_the_default_tiny_model(self, tmp_path: Path) -> None:
        tiny = tmp_path / "tiny-a"
        frontend = cli_args.parse_frontend_args([], environ={}, default_model_dir=lambda: tiny)
        assert frontend.model_dir == tiny
        assert frontend.served_model_name == "tiny-a"

    def test_prefix_caching_is_on_by_default_and_can_be_turned_off(self) -> None:
        kw = dict(environ={}, default_model_dir=no_default_model)
        assert cli_args.parse_scheduler_args(["--model", str(MODEL)], **kw).enable_prefix_caching
        scheduler = cli_args.parse_scheduler_args(["--model", str(MODEL), "--no-enable-prefix-caching"],
                                                  **kw)
        assert scheduler.enable_prefix_caching is False

    def test_async_scheduling_is_on_by_default_and_can_be_turned_off(self) -> None:
        kw = dict(environ={}, default_model_dir=no_default_model)
        assert cli_args.parse_scheduler_args(["--model", str(MODEL)], **kw).async_scheduling
        scheduler = cli_args.parse_scheduler_args(["--model", str(MODEL), "--no-async-scheduling"], **kw)
        assert scheduler.async_scheduling is False

    def test_constrained_requests_wait_under_pressure_unless_replay_is_asked(self) -> None:
        kw = dict(environ={}, default_model_dir=no_default_model)
        assert cli_args.parse_scheduler_args(["--model", str(MODEL)], **kw).preempt_constrained == "wait"
        replay = cli_args.parse_scheduler_args(["--model", str(MODEL), "--preempt-constrained", "replay"],
                                               **kw)
        assert replay.preempt_constrained == "replay"

    def test_service_ports_default_to_the_documented_ones(self) -> None:
        stack = cli_args.parse_stack_args(["--model", str(MODEL)], environ={}, default_model_dir=no_default_model)
        assert (stack.frontend.port, stack.scheduler.port, stack.worker.port) == (8000, 50051, 50061)

    def test_cpu_backend_has_no_devices_and_auto_dtype(self) -> None:
        worker = cli_args.parse_worker_args(["--model", str(MODEL)], environ={}, default_model_dir=no_default_model)
        assert worker.topology.devices == () and worker.dtype is None

    @pytest.mark.parametrize("text,expected", [("4GiB", 4 << 30), ("512MiB", 512 << 20), ("2G", 2 << 30),
                                               ("1048576", 1 << 20)])
    def test_kv_cache_memory_sizes(self, text: str, expected: int) -> None:
        worker = cli_args.parse_worker_args(["--model", str(MODEL), "--kv-cache-memory", text],
                                            environ={}, default_model_dir=no_default_model)
        assert worker.kv_cache_memory_bytes == expected


def test_speculation_and_prefix_caching_flags_warn_nothing(caplog) -> None:
    """Both are implemented: accepting them says nothing."""
    from services.common.cli_args import parse_scheduler_args

    with caplog.at_level("WARNING"):
        parse_scheduler_args(["--model", "/tmp", "--enable-prefix-caching", "--speculative-config",
                              '{"method":"dspark","num_speculative_tokens":7}'])
    assert "--enable-prefix-caching" not in caplog.text
    assert "--speculative-config" not in caplog.text
