"""What a fresh machine, CI and Docker rely on: the entry points, the two make targets, the compose file.

No Docker engine is needed: the compose file is parsed and every service's command goes through the
real argparse of its `dsv4serve` subcommand.
"""
from __future__ import annotations

import re
import stat
import tomllib
from pathlib import Path

import pytest
import yaml

from services import cli
from services.common import cli_args

REPO_ROOT = Path(__file__).resolve().parents[1]
COMPOSE = REPO_ROOT / "docker" / "docker-compose.yml"
SERVICE_PARSERS = {
    "worker": cli_args.parse_worker_args,
    "scheduler": cli_args.parse_scheduler_args,
    "frontend": cli_args.parse_frontend_args,
}


def compose_services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def with_compose_defaults(word: str) -> str:
    """`${VAR:-default}` → default, as compose does when VAR is unset."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", word)


def command_of(service: dict) -> list[str]:
    return [with_compose_defaults(word) for word in service["command"]]


def no_default_model() -> Path:
    raise AssertionError("compose commands name their model explicitly")


def test_console_script_points_at_the_cli() -> None:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {"dsv4serve": "services.cli:main"}
    assert callable(cli.main)


def test_every_documented_subcommand_exists() -> None:
    assert set(cli.COMMANDS) >= {"stack", "scheduler", "worker", "frontend", "make-tiny-checkpoint", "check"}


@pytest.mark.parametrize("service", ["worker", "scheduler", "frontend"])
def test_each_service_has_a_module_entry_point(service: str) -> None:
    text = (REPO_ROOT / "services" / service / "__main__.py").read_text()
    assert f'main(["{service}", *sys.argv[1:]])' in text


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = REPO_ROOT / ".ci" / "run"
    lines = [line for line in ci.read_text().splitlines() if line and not line.startswith("#")]
    assert ci.read_text().startswith("#!/usr/bin/env bash\n")
    assert ci.stat().st_mode & stat.S_IXUSR
    assert lines[0] == "set -euo pipefail" and lines[-1] == "make test"
    readme = (REPO_ROOT / "README.md").read_text()
    assert "make test" in readme and "make run" in readme


def test_make_setup_installs_cpu_torch_first_and_is_stamped_on_pyproject() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    torch_at = makefile.index('pip install --quiet "torch==$(TORCH_VERSION)"')
    assert torch_at < makefile.index("pip install --quiet -e '.[test]'")
    assert "TORCH_VERSION ?= 2.13.0" in makefile
    assert "sha256sum pyproject.toml" in makefile


def test_dockerfile_uses_the_same_cpu_torch_pin_and_installs_the_project() -> None:
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "ARG BASE_IMAGE=python:3.11-slim\nFROM ${BASE_IMAGE}\n" in dockerfile
    assert "ARG TORCH_VERSION=2.13.0" in dockerfile and "download.pytorch.org/whl/cpu" in dockerfile
    assert "RUN pip install --no-deps ." in dockerfile


def test_compose_has_three_services_from_one_image() -> None:
    services = compose_services()
    assert set(services) == {"worker", "scheduler", "frontend"}
    assert len({(s["image"], s["build"]["dockerfile"]) for s in services.values()}) == 1


@pytest.mark.parametrize("name", ["worker", "scheduler", "frontend"])
def test_compose_commands_parse_with_the_real_flags(name: str) -> None:
    command = command_of(compose_services()[name])
    assert command[:2] == ["dsv4serve", name]
    config = SERVICE_PARSERS[name](command[2:], environ={}, default_model_dir=no_default_model)
    assert config.host == "0.0.0.0"


def test_compose_services_reach_each_other_and_agree_on_the_model() -> None:
    services = compose_services()
    kw = dict(environ={}, default_model_dir=no_default_model)
    worker = cli_args.parse_worker_args(command_of(services["worker"])[2:], **kw)
    scheduler = cli_args.parse_scheduler_args(command_of(services["scheduler"])[2:], **kw)
    frontend = cli_args.parse_frontend_args(command_of(services["frontend"])[2:], **kw)

    assert scheduler.worker_addresses == (f"worker:{worker.port}",)
    assert frontend.scheduler_address == f"scheduler:{scheduler.port}"
    assert worker.model_dir == scheduler.model_dir == frontend.model_dir
    assert scheduler.served_model_name == frontend.served_model_name
    assert worker.max_model_len == scheduler.max_model_len


def test_compose_healthchecks_probe_each_service_on_its_own_port() -> None:
    services = compose_services()
    expected = {
        "worker": ["CMD", "dsv4serve", "probe", "grpc", "127.0.0.1:50061"],
        "scheduler": ["CMD", "dsv4serve", "probe", "grpc", "127.0.0.1:50051"],
        "frontend": ["CMD", "dsv4serve", "probe", "http", "http://127.0.0.1:8000/health"],
    }
    for name, test in expected.items():
        assert services[name]["healthcheck"]["test"] == test
        port = re.search(r":(\d+)", test[-1]).group(1)
        assert command_of(services[name])[-2:] == ["--port", port]


def test_compose_starts_services_in_dependency_order_when_healthy() -> None:
    services = compose_services()
    assert services["scheduler"]["depends_on"] == {"worker": {"condition": "service_healthy"}}
    assert services["frontend"]["depends_on"] == {"scheduler": {"condition": "service_healthy"}}


def test_frontend_can_scale_without_host_port_conflicts() -> None:
    ports = [str(p) for p in compose_services()["frontend"]["ports"]]
    assert ports and all(":" not in p for p in ports), "a fixed host port breaks --scale frontend=N"


def test_probe_subcommand_reports_an_unreachable_target() -> None:
    assert cli.main(["probe", "grpc", "127.0.0.1:1", "--timeout", "0.5"]) == 1
    assert cli.main(["probe", "http", "http://127.0.0.1:1/health", "--timeout", "0.5"]) == 1


def test_the_16_rank_compose_file_covers_the_world_once_through_one_rendezvous() -> None:
    services = yaml.safe_load((REPO_ROOT / "docker" / "docker-compose.16rank.yml").read_text())[
        "services"]
    kw = dict(environ={}, default_model_dir=no_default_model)
    workers = {name: cli_args.parse_worker_args(command_of(services[name])[2:], **kw)
               for name in ("worker-a", "worker-b")}
    scheduler = cli_args.parse_scheduler_args(command_of(services["scheduler"])[2:], **kw)
    ranks = sorted(rank for worker in workers.values() for rank in worker.driven_ranks)
    assert ranks == list(range(16))
    assert {w.topology.world_size for w in workers.values()} == {16}
    assert {w.dist_init_addr for w in workers.values()} == {"worker-a:29500"}
    assert 0 in workers["worker-a"].driven_ranks  # the rendezvous host drives rank 0
    assert scheduler.worker_addresses == ("worker-a:50061", "worker-b:50061")
