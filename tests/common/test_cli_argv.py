"""Config objects → the launcher's child command lines: each child rebuilds the same config, the API
key travels in the environment only."""
from __future__ import annotations

from services.common import cli_args, cli_argv
from tests.common.cli_helpers import GUIDE_ARGV, MODEL, no_default_model


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
