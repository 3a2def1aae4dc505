"""TLS, back-pressure, timeouts, graceful stop and log-format flags: validated, passed to every
child, and the secure compose override uses only flags the services know."""
from __future__ import annotations

from pathlib import Path

from services.common import cli_args, cli_argv
from tests.common.cli_helpers import MODEL, no_default_model, parse_error


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
