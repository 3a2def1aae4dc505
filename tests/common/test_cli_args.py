"""Operators' flags → config objects: the guide's command line works, mistakes name their flag."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from services.common import cli_args, cli_argv
from services.common.config import GenerateDefaults, SpeculativeConfig

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

    @pytest.mark.parametrize("spec", ['{"method":"mtp","num_speculative_tokens":5}',
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


class TestChildArgvRoundTrip:
    """The launcher starts its children with `*_argv(config)`; they must rebuild the same config."""

    def test_every_service_rebuilds_its_config(self) -> None:
        argv = GUIDE_ARGV + ["--num-blocks", "512", "--dtype", "bfloat16", "--no-enable-prefix-caching",
                             "--no-async-scheduling", "--preempt-constrained", "replay"]
        stack = cli_args.parse_stack_args(argv, environ={}, default_model_dir=no_default_model)
        kw = dict(environ={}, default_model_dir=no_default_model)

        assert cli_args.parse_worker_args(cli_argv.worker_argv(stack.worker), **kw) == stack.worker
        assert cli_args.parse_scheduler_args(cli_argv.scheduler_argv(stack.scheduler), **kw) == stack.scheduler
        assert cli_args.parse_frontend_args(cli_argv.frontend_argv(stack.frontend), **kw) == stack.frontend

    def test_frontend_bounds_and_key_round_trip_with_the_key_in_the_environment(self) -> None:
        argv = ["--model", str(MODEL), "--api-key", "sk-1", "--auth-exempt-paths", "",
                "--max-request-body-bytes", "1MiB", "--max-json-depth", "40", "--max-tools", "8",
                "--max-schema-depth", "6", "--max-schema-nodes", "100", "--max-schema-properties", "50",
                "--max-enum-values", "20", "--max-schema-length", "999", "--max-grammar-bytes", "64KiB"]
        stack = cli_args.parse_stack_args(argv, environ={}, default_model_dir=no_default_model)
        frontend_argv = cli_argv.frontend_argv(stack.frontend)

        assert "sk-1" not in frontend_argv
        rebuilt = cli_args.parse_frontend_args(frontend_argv, environ=cli_argv.frontend_env(stack.frontend),
                                               default_model_dir=no_default_model)
        assert rebuilt == stack.frontend
        assert stack.frontend.auth_exempt_paths == ()
        assert (stack.frontend.bounds.max_request_body_bytes, stack.frontend.bounds.schema.max_grammar_bytes) \
            == (1 << 20, 64 << 10)

    def test_api_key_flag_wins_over_the_environment(self) -> None:
        env = {"DSV4SERVE_API_KEY": "from-env"}
        kw = dict(environ=env, default_model_dir=no_default_model)
        assert cli_args.parse_frontend_args(["--model", str(MODEL)], **kw).api_key == "from-env"
        assert cli_args.parse_frontend_args(["--model", str(MODEL), "--api-key", "flag"], **kw).api_key == "flag"
        assert cli_args.parse_frontend_args(["--model", str(MODEL)], environ={},
                                            default_model_dir=no_default_model).api_key is None

    def test_the_key_is_never_printed(self) -> None:
        frontend = cli_args.parse_frontend_args(["--model", str(MODEL), "--api-key", "sk-secret"],
                                                environ={}, default_model_dir=no_default_model)
        assert "sk-secret" not in repr(frontend)

    def test_defaults_round_trip(self) -> None:
        stack = cli_args.parse_stack_args(["--model", str(MODEL)], environ={}, default_model_dir=no_default_model)
        kw = dict(environ={}, default_model_dir=no_default_model)

        assert cli_args.parse_worker_args(cli_argv.worker_argv(stack.worker), **kw) == stack.worker
        assert cli_args.parse_scheduler_args(cli_argv.scheduler_argv(stack.scheduler), **kw) == stack.scheduler


def test_speculation_and_prefix_caching_flags_warn_nothing(caplog) -> None:
    """Both are implemented: accepting them says nothing."""
    from services.common.cli_args import parse_scheduler_args

    with caplog.at_level("WARNING"):
        parse_scheduler_args(["--model", "/tmp", "--enable-prefix-caching", "--speculative-config",
                              '{"method":"dspark","num_speculative_tokens":7}'])
    assert "--enable-prefix-caching" not in caplog.text
    assert "--speculative-config" not in caplog.text


class TestOpsFlags:
    """TLS, back-pressure, timeouts, graceful stop and log format: validated, and passed down."""

    def test_certificate_without_its_key_names_both_flags(self, capsys, tmp_path: Path) -> None:
        (tmp_path / "c.pem").write_text("x")
        err = parse_error(capsys, cli_args.parse_scheduler_args,
                          ["--model", str(MODEL), "--tls-cert", str(tmp_path / "c.pem")])
        assert "--tls-cert and --tls-key go together" in err

    def test_missing_certificate_file_names_the_flag(self, capsys, tmp_path: Path) -> None:
        err = parse_error(capsys, cli_args.parse_frontend_args,
                          ["--model", str(MODEL), "--tls-ca", str(tmp_path / "nope.pem")])
        assert "--tls-ca" in err and "no such file" in err

    def test_a_grpc_server_with_a_ca_needs_its_own_certificate(self, capsys, tmp_path: Path) -> None:
        (tmp_path / "ca.pem").write_text("x")
        err = parse_error(capsys, cli_args.parse_worker_args,
                          ["--model", str(MODEL), "--tls-ca", str(tmp_path / "ca.pem")])
        assert "--tls-ca" in err and "--tls-cert" in err

    def test_every_ops_flag_reaches_each_child(self, tmp_path: Path) -> None:
        for name in ("c.pem", "k.pem", "ca.pem"):
            (tmp_path / name).write_text("x")
        argv = ["--model", str(MODEL), "--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem"),
                "--tls-ca", str(tmp_path / "ca.pem"), "--no-grpc-reflection", "--max-waiting-requests", "32",
                "--request-timeout-s", "2.5", "--shutdown-grace-s", "3", "--log-format", "json",
                "--restart-on-failure"]
        stack = cli_args.parse_stack_args(argv, environ={}, default_model_dir=no_default_model)
        kw = dict(environ={}, default_model_dir=no_default_model)

        assert stack.restart_on_failure and stack.scheduler.max_waiting_requests == 32
        assert stack.frontend.request_timeout_s == 2.5
        for cfg in (stack.worker, stack.scheduler, stack.frontend):
            assert cfg.ops.tls.ca_file == tmp_path / "ca.pem" and cfg.ops.log_format == "json"
            assert cfg.ops.shutdown_grace_s == 3.0
        assert not stack.worker.ops.grpc_reflection and not stack.scheduler.ops.grpc_reflection
        assert cli_args.parse_worker_args(cli_argv.worker_argv(stack.worker), **kw) == stack.worker
        assert cli_args.parse_scheduler_args(cli_argv.scheduler_argv(stack.scheduler), **kw) == stack.scheduler
        assert cli_args.parse_frontend_args(cli_argv.frontend_argv(stack.frontend), **kw) == stack.frontend


def test_the_secure_compose_override_uses_only_flags_the_services_know() -> None:
    """docker/docker-compose.secure.yml's commands parse with the services' own parsers."""
    import re

    import yaml

    from services.common import cli_flags

    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker" / "docker-compose.secure.yml").read_text())
    parsers = {"worker": cli_flags.build_worker_parser(), "scheduler": cli_flags.build_scheduler_parser(),
               "frontend": cli_flags.build_frontend_parser()}
    for name, service in compose["services"].items():
        command = [re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", part) for part in service["command"]]
        assert command[:2] == ["dsv4serve", name]
        args = parsers[name].parse_args(command[2:])
        assert args.tls_ca == Path("/certs/ca.pem") and args.log_format == "json"
        assert f"/certs/{name}.pem:ro" in " ".join(service["volumes"])


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
