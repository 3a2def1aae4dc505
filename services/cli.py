"""`dsv4serve` (also `python -m services.cli`): one entry point for every way to run the project.

    dsv4serve stack [flags]          worker + scheduler + frontend as local processes
    dsv4serve worker|scheduler|frontend [flags]
    dsv4serve make-tiny-checkpoint [args]
    dsv4serve make-demo-checkpoint OUT_DIR   the default model (trained demo), written somewhere explicit
    dsv4serve train-demo OUT_DIR [args]   train the demo model (the default model's recipe)
    dsv4serve train-demo-draft OUT_DIR [args]   train the demo's DSpark draft on the demo target
    dsv4serve average-demo OUT_DIR RUN_DIR...   the demo model averaged over train-demo runs
    dsv4serve tune-demo-mtp OUT_DIR [args]   train the demo target's MTP block for chained drafts
    dsv4serve check [--url URL]      the post-upgrade check: health, one constrained tool call, one chat
    dsv4serve probe grpc ADDR | probe http URL   exit 0 when ready (container health checks)

Service modules are imported inside their subcommand, so `check` and `probe` stay light and one
service's missing dependency never breaks another's command.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Coroutine, Optional, Sequence

from services.common import cli_args, cli_flags, cli_values
from services.common.logs import configure_logging

logger = logging.getLogger("dsv4serve")


def run_stack(argv: Sequence[str]) -> int:
    from services import launcher

    config = cli_args.parse_stack_args(argv)
    configure_logging(config.frontend.ops.log_format, "launcher")
    return launcher.run_stack(config)


def run_worker(argv: Sequence[str]) -> int:
    config = cli_args.parse_worker_args(argv)
    configure_logging(config.ops.log_format, "worker")
    from services.worker.server import serve

    return _run_service(serve(config))


def run_scheduler(argv: Sequence[str]) -> int:
    config = cli_args.parse_scheduler_args(argv)
    configure_logging(config.ops.log_format, "scheduler")
    from services.scheduler.server import serve

    return _run_service(serve(config))


def run_frontend(argv: Sequence[str]) -> int:
    config = cli_args.parse_frontend_args(argv)
    configure_logging(config.ops.log_format, "frontend")
    from services.frontend.serving import serve

    return _run_service(serve(config))


def _run_service(service: Coroutine[Any, Any, None]) -> int:
    import uvloop

    try:
        uvloop.run(service)
    except KeyboardInterrupt:
        pass
    return 0


def run_make_tiny_checkpoint(argv: Sequence[str]) -> int:
    from services.worker.model import tiny_checkpoint

    return tiny_checkpoint.main(list(argv)) or 0


def run_make_demo_checkpoint(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="dsv4serve make-demo-checkpoint", description=(
        "Write the trained demo model (the default model) as a full DeepSeek-V4 checkpoint."))
    parser.add_argument("out_dir", help="output directory (created if needed)")
    parser.add_argument("--dspark", action="store_true",
                        help="the DSpark variant: the demo target with its trained DSpark draft")
    args = parser.parse_args(list(argv))
    from services.demo.export import COMPACT_DIR, expand

    if args.dspark:
        from services.demo.draft_export import expand_dspark

        print(f"wrote {expand_dspark(COMPACT_DIR, args.out_dir)}")
        return 0
    print(f"wrote {expand(COMPACT_DIR, args.out_dir)}")
    return 0


def run_train_demo(argv: Sequence[str]) -> int:
    from services.demo import train_cli

    return train_cli.main(list(argv))


def run_train_demo_draft(argv: Sequence[str]) -> int:
    from services.demo import draft_cli

    return draft_cli.main(list(argv))


def run_average_demo(argv: Sequence[str]) -> int:
    from services.demo import average_cli

    return average_cli.main(list(argv))


def run_tune_demo_mtp(argv: Sequence[str]) -> int:
    from services.demo import mtp_cli

    return mtp_cli.main(list(argv))


# ---- probe: readiness for container health checks ----

def run_probe(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="dsv4serve probe", description="Exit 0 when the target is ready.")
    parser.add_argument("kind", choices=["grpc", "http"])
    parser.add_argument("target", help="gRPC host:port, or an HTTP URL such as http://127.0.0.1:8000/health")
    parser.add_argument("--service", default="", help="gRPC health service name (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    parser.add_argument("--tls-cert", type=Path, default=None, metavar="PEM",
                        help="client certificate (for a server that requires one: --tls-ca on it)")
    parser.add_argument("--tls-key", type=Path, default=None, metavar="PEM", help="the key of --tls-cert")
    parser.add_argument("--tls-ca", type=Path, default=None, metavar="PEM", help="CA to verify the server")
    args = parser.parse_args(list(argv))
    if args.kind == "grpc":
        from services.common.config import TlsConfig
        from services.common.grpc_server import probe_health

        tls = TlsConfig(cert_file=args.tls_cert, key_file=args.tls_key, ca_file=args.tls_ca)
        return 0 if probe_health(args.target, args.service, args.timeout, tls) else 1
    import httpx

    try:
        return 0 if httpx.get(args.target, timeout=args.timeout, trust_env=False).status_code == 200 else 1
    except httpx.HTTPError:
        return 1


# ---- check: what an operator verifies after a restart, before restoring traffic ----

@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str


SHELL_TOOL = {"type": "function", "function": {
    "name": "shell", "description": "Run a shell command", "strict": True,
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"], "additionalProperties": False}}}


def check_health(client: Any) -> CheckResult:
    response = client.get("/health")
    return CheckResult("health", response.status_code == 200, f"GET /health → {response.status_code}")


def check_constrained_tool_call(client: Any, model: str, max_tokens: int) -> CheckResult:
    body = {"model": model, "messages": [{"role": "user", "content": "Show the current directory."}],
            "tools": [SHELL_TOOL], "tool_choice": "required", "temperature": 0, "max_tokens": max_tokens}
    name = "constrained tool call"
    choice, problem = _first_choice(client.post("/v1/chat/completions", json=body))
    if problem:
        return CheckResult(name, False, problem)
    calls = choice["message"].get("tool_calls") or []
    if choice.get("finish_reason") != "tool_calls" or not calls:
        return CheckResult(name, False, f"finish_reason {choice.get('finish_reason')!r} with {len(calls)} tool call(s)")
    function = calls[0]["function"]
    try:
        arguments = json.loads(function["arguments"])
    except (json.JSONDecodeError, TypeError):
        return CheckResult(name, False, f"arguments are not JSON: {function.get('arguments')!r:.200}")
    valid = (function["name"] == "shell" and isinstance(arguments, dict) and set(arguments) == {"command"}
             and isinstance(arguments["command"], str))
    return CheckResult(name, valid, f"{function['name']}({json.dumps(arguments)[:200]})")


def check_ordinary_chat(client: Any, model: str, max_tokens: int) -> CheckResult:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
            "temperature": 0, "max_tokens": max_tokens}
    choice, problem = _first_choice(client.post("/v1/chat/completions", json=body))
    if problem:
        return CheckResult("ordinary chat", False, problem)
    reason = choice.get("finish_reason")
    content = choice["message"].get("content") or ""
    return CheckResult("ordinary chat", reason in ("stop", "length"),
                       f"finish_reason {reason!r}, {len(content)} characters of content")


def _first_choice(response: Any) -> tuple[dict[str, Any], Optional[str]]:
    if response.status_code != 200:
        return {}, f"HTTP {response.status_code}: {response.text[:300]}"
    choices = response.json().get("choices") or []
    if not choices or "message" not in choices[0]:
        return {}, f"no message in the response: {response.text[:300]}"
    return choices[0], None


def run_check(argv: Sequence[str], out: Any = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="dsv4serve check", description=(
        "After a restart: health, one constrained tool request and one ordinary chat request. "
        "Prints PASS/FAIL per check; exit status 0 only when all pass."))
    parser.add_argument("--url", default=f"http://127.0.0.1:{cli_flags.DEFAULT_FRONTEND_PORT}", help="frontend URL")
    parser.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    parser.add_argument("--max-tokens", type=cli_values.positive_int, default=256)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help=f"the gateway's API key (default: ${cli_flags.API_KEY_ENV})")
    args = parser.parse_args(list(argv))
    import httpx

    api_key = args.api_key or os.environ.get(cli_flags.API_KEY_ENV)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=args.url, timeout=args.timeout, trust_env=False,
                      headers=headers) as client:
        results = run_checks(client, args.model, args.max_tokens, out)
    return 0 if all(r.passed for r in results) else 1


def run_checks(client: Any, model: Optional[str], max_tokens: int, out: Any) -> list[CheckResult]:
    """Run the three checks in order with an httpx client, printing PASS/FAIL as each completes."""
    import httpx

    checks: list[tuple[str, Callable[[], CheckResult]]] = [
        ("health", lambda: check_health(client)),
        ("constrained tool call",
         lambda: check_constrained_tool_call(client, model or _served_model(client), max_tokens)),
        ("ordinary chat", lambda: check_ordinary_chat(client, model or _served_model(client), max_tokens)),
    ]
    results = []
    for name, check in checks:
        try:
            result = check()
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            result = CheckResult(name, False, f"{type(exc).__name__}: {exc}")
        results.append(result)
        print(f"{'PASS' if result.passed else 'FAIL'} {result.name}: {result.detail}", file=out, flush=True)
    return results


def _served_model(client: Any) -> str:
    response = client.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


# ---- entry point ----

COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "stack": run_stack,
    "worker": run_worker,
    "scheduler": run_scheduler,
    "frontend": run_frontend,
    "make-tiny-checkpoint": run_make_tiny_checkpoint,
    "make-demo-checkpoint": run_make_demo_checkpoint,
    "train-demo": run_train_demo,
    "train-demo-draft": run_train_demo_draft,
    "average-demo": run_average_demo,
    "tune-demo-mtp": run_tune_demo_mtp,
    "check": run_check,
    "probe": run_probe,
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="dsv4serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=list(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own flags (--help for each)")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    args = parser.parse_args(argv[:1])
    configure_logging("text", args.command)  # services switch to their --log-format once parsed
    from services.launcher import follow_launcher

    follow_launcher(os.environ)
    return COMMANDS[args.command](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
