"""Command-line flags of every service and of the all-in-one launcher → frozen config objects.

Every mistake is reported at startup by a message that names the flag (argparse exits with status 2).
Settings that only mean something on NPU (`--platform`, `--ring-heap`, `PYPTO_*` variables) are
accepted so the guide's command line runs, and each one is named in a warning: ignored, but never
silently. The flags themselves are in `cli_flags.py`, their value parsers in `cli_values.py`, and the
way back (config → argv, for the launcher's children) in `cli_argv.py`.
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from services.common.cli_flags import (API_KEY_ENV, LOCAL_HOST, build_frontend_parser,
                                       build_scheduler_parser, build_stack_parser, build_worker_parser)
from services.common.cli_values import DSPARK_METHOD
from services.common.config import (FrontendConfig, OpsConfig, RequestBounds, SchedulerConfig,
                                    SchemaBounds, StackConfig, TlsConfig, TopologyConfig,
                                    WorkerConfig)

logger = logging.getLogger(__name__)

DSPARK_BLOCK_SIZE = 32
NPU_ONLY_ENV_PREFIX = "PYPTO_"

ModelDirResolver = Callable[[], Path]


class FlagError(ValueError):
    """An invalid flag value or combination; the message starts with the flag's name."""


# ---- validation and config objects ----

def npu_only_warnings(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """One message per NPU-only setting present on the command line or in the environment."""
    messages = [
        f"{flag} {value} is an NPU-only setting; it has no effect in dsv4serve and is ignored"
        for flag, value in (("--platform", args.platform), ("--ring-heap", args.ring_heap))
        if value is not None
    ]
    messages += [
        f"environment variable {name} is an NPU-only (PyPTO) setting; it has no effect in dsv4serve"
        for name in sorted(environ) if name.startswith(NPU_ONLY_ENV_PREFIX)
    ]
    return messages


def topology_from_args(args: argparse.Namespace) -> TopologyConfig:
    if args.backend == "npu":
        raise FlagError("--backend npu is not supported: dsv4serve runs the model with torch; "
                        "use --backend cpu or --backend cuda (NPU kernels are not available here)")
    if args.backend not in ("cpu", "cuda"):
        raise FlagError(f"--backend {args.backend}: choose cpu or cuda")
    world = args.dp * args.tp
    if world % args.ep != 0:
        raise FlagError(f"--ep {args.ep} must divide the world size --dp {args.dp} × --tp {args.tp} = {world}")
    devices = args.devices
    if args.backend == "cuda" and not devices:
        devices = tuple(range(world))
    if devices and len(devices) != world:
        raise FlagError(f"--devices lists {len(devices)} device(s) but --dp {args.dp} × --tp {args.tp} = "
                        f"{world} ranks; list exactly one device per rank")
    return TopologyConfig(backend=args.backend, devices=devices, dp=args.dp, tp=args.tp, ep=args.ep)


def check_speculative(args: argparse.Namespace, topology: Optional[TopologyConfig]) -> None:
    """DSpark serves dp×tp attention with experts over every rank, in 32-token blocks. (Whether
    this build can draft on the layout is the worker's startup check: worker/speculation.py.)"""
    spec = getattr(args, "speculative_config", None)
    if spec is None or spec.method != DSPARK_METHOD:
        return
    if args.block_size != DSPARK_BLOCK_SIZE:
        raise FlagError(f"--block-size {args.block_size}: --speculative-config method {DSPARK_METHOD} "
                        f"needs --block-size {DSPARK_BLOCK_SIZE}")
    if topology is not None and topology.ep != topology.world_size:
        raise FlagError(f"--ep {topology.ep}: --speculative-config method {DSPARK_METHOD} needs --ep equal to "
                        f"the world size --dp {topology.dp} × --tp {topology.tp} = {topology.world_size}")


def check_host_ranks(args: argparse.Namespace, topology: TopologyConfig) -> None:
    """--ranks must lie inside the world; a worker driving part of it needs --dist-init-addr."""
    ranks = getattr(args, "ranks", None)
    if ranks is None:
        return
    if ranks[-1] >= topology.world_size:
        raise FlagError(f"--ranks lists rank {ranks[-1]}, but --dp {topology.dp} × --tp {topology.tp} "
                        f"makes ranks 0..{topology.world_size - 1}")
    if ranks != tuple(range(topology.world_size)) and args.dist_init_addr is None:
        raise FlagError(f"--ranks {_describe_ranks(ranks)} drives part of a {topology.world_size}-rank world: "
                        f"--dist-init-addr HOST:PORT must name the rendezvous (served by the worker "
                        f"driving rank 0)")


def _describe_ranks(ranks: tuple[int, ...]) -> str:
    return ",".join(map(str, ranks))
def ops_from_args(args: argparse.Namespace, serves_grpc: bool) -> OpsConfig:
    tls = TlsConfig(cert_file=args.tls_cert, key_file=args.tls_key, ca_file=args.tls_ca)
    return OpsConfig(tls=tls, grpc_reflection=args.grpc_reflection if serves_grpc else True,
                     shutdown_grace_s=args.shutdown_grace_s, log_format=args.log_format)


def check_tls(args: argparse.Namespace, serves_grpc: bool) -> None:
    """A certificate needs its key (and the reverse); a gRPC server with a CA needs a certificate;
    every file named must exist."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise FlagError("--tls-cert and --tls-key go together: give both or neither")
    if serves_grpc and args.tls_ca is not None and args.tls_cert is None:
        raise FlagError("--tls-ca makes the gRPC server require client certificates, so it needs "
                        "its own --tls-cert and --tls-key")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key), ("--tls-ca", args.tls_ca)):
        if path is not None and not path.is_file():
            raise FlagError(f"{flag} {path}: no such file")


def worker_config_from_args(args: argparse.Namespace, model_dir: Path) -> WorkerConfig:
    return WorkerConfig(
        model_dir=model_dir, host=args.host, port=args.port, topology=topology_from_args(args),
        block_size=args.block_size, max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        num_blocks=args.num_blocks,
        kv_cache_memory_bytes=args.kv_cache_memory, dtype=args.dtype, speculative=args.speculative_config,
        torch_threads=args.torch_threads, ranks=getattr(args, "ranks", None),
        dist_init_addr=getattr(args, "dist_init_addr", None),
        ops=ops_from_args(args, serves_grpc=True),
    )


def scheduler_config_from_args(args: argparse.Namespace, model_dir: Path,
                               worker_addresses: tuple[str, ...]) -> SchedulerConfig:
    return SchedulerConfig(
        model_dir=model_dir, served_model_name=args.served_model_name or model_dir.name,
        worker_addresses=worker_addresses, host=args.host, port=args.port,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold, block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching, async_scheduling=args.async_scheduling,
        preempt_constrained=args.preempt_constrained, speculative=args.speculative_config,
        generate_defaults=args.generate_config, max_waiting_requests=args.max_waiting_requests,
        ops=ops_from_args(args, serves_grpc=True),
    )


def frontend_config_from_args(args: argparse.Namespace, model_dir: Path, scheduler_address: str) -> FrontendConfig:
    return FrontendConfig(
        model_dir=model_dir, served_model_name=args.served_model_name or model_dir.name,
        scheduler_address=scheduler_address, host=args.host, port=args.port,
        generate_defaults=args.generate_config, request_timeout_s=args.request_timeout_s,
        ops=ops_from_args(args, serves_grpc=False), bounds=request_bounds_from_args(args),
        api_key=args.api_key, auth_exempt_paths=args.auth_exempt_paths,
    )


def request_bounds_from_args(args: argparse.Namespace) -> RequestBounds:
    schema = SchemaBounds(
        max_depth=args.max_schema_depth, max_nodes=args.max_schema_nodes,
        max_properties=args.max_schema_properties, max_enum_values=args.max_enum_values,
        max_length_keyword=args.max_schema_length, max_grammar_bytes=args.max_grammar_bytes)
    return RequestBounds(max_request_body_bytes=args.max_request_body_bytes,
                         max_json_depth=args.max_json_depth, max_tools=args.max_tools, schema=schema)


def stack_config_from_args(args: argparse.Namespace, model_dir: Path) -> StackConfig:
    worker_args = argparse.Namespace(**{**vars(args), "host": LOCAL_HOST, "port": args.worker_port})
    scheduler_args = argparse.Namespace(**{**vars(args), "host": LOCAL_HOST, "port": args.scheduler_port})
    worker = worker_config_from_args(worker_args, model_dir)
    scheduler = scheduler_config_from_args(scheduler_args, model_dir, (f"{LOCAL_HOST}:{args.worker_port}",))
    frontend = frontend_config_from_args(args, model_dir, f"{LOCAL_HOST}:{args.scheduler_port}")
    return StackConfig(worker=worker, scheduler=scheduler, frontend=frontend,
                       startup_timeout_s=args.startup_timeout, log_dir=args.log_dir, ready_file=args.ready_file,
                       restart_on_failure=args.restart_on_failure)


# ---- entry points: argv → config ----

def parse_worker_args(argv: Sequence[str], environ: Optional[Mapping[str, str]] = None,
                      default_model_dir: Optional[ModelDirResolver] = None) -> WorkerConfig:
    return _parse(build_worker_parser(), argv, environ, default_model_dir,
                  lambda args, model: worker_config_from_args(args, model))


def parse_scheduler_args(argv: Sequence[str], environ: Optional[Mapping[str, str]] = None,
                         default_model_dir: Optional[ModelDirResolver] = None) -> SchedulerConfig:
    return _parse(build_scheduler_parser(), argv, environ, default_model_dir,
                  lambda args, model: scheduler_config_from_args(args, model, args.workers))


def parse_frontend_args(argv: Sequence[str], environ: Optional[Mapping[str, str]] = None,
                        default_model_dir: Optional[ModelDirResolver] = None) -> FrontendConfig:
    return _parse(build_frontend_parser(), argv, environ, default_model_dir,
                  lambda args, model: frontend_config_from_args(args, model, args.scheduler))


def parse_stack_args(argv: Sequence[str], environ: Optional[Mapping[str, str]] = None,
                     default_model_dir: Optional[ModelDirResolver] = None) -> StackConfig:
    return _parse(build_stack_parser(), argv, environ, default_model_dir, stack_config_from_args)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str], environ: Optional[Mapping[str, str]],
           default_model_dir: Optional[ModelDirResolver],
           build: Callable[[argparse.Namespace, Path], Any]) -> Any:
    args = parser.parse_args(list(argv))
    environ = os.environ if environ is None else environ
    if getattr(args, "api_key", "") is None:
        args.api_key = environ.get(API_KEY_ENV) or None   # the flag wins over the environment
    for message in npu_only_warnings(args, environ):
        logger.warning(message)
    try:
        check_flags(args)
    except FlagError as exc:
        parser.error(str(exc))
    # Resolved only after every flag checked out: generating the default model takes a while.
    model_dir = args.model or (default_model_dir or demo_default_model_dir)()
    try:
        check_topology_fits_model(args, model_dir)
    except FlagError as exc:
        parser.error(str(exc))
    return build(args, model_dir)


def check_topology_fits_model(args: argparse.Namespace, model_dir: Path) -> None:
    """--tp and --ep must divide what they split in the model (a FlagError names both), and the
    model must serve --speculative-config."""
    if not hasattr(args, "tp"):
        return
    from services.worker.model.config import ModelConfig
    from services.worker.model.config_fields import ConfigError
    from services.worker.model.parallel import TopologyError, check_topology
    from services.worker.speculation import SpeculationError, check_speculation

    try:
        model = ModelConfig.from_json_file(Path(model_dir) / "config.json")
    except (OSError, ConfigError):
        return  # the worker reports an unreadable model with its own, precise error
    try:
        check_topology(model, args.dp, args.tp, args.ep)
        check_speculation(getattr(args, "speculative_config", None), model)
    except (TopologyError, SpeculationError) as error:
        raise FlagError(f"{error} (model {model_dir})") from None


def check_flags(args: argparse.Namespace) -> None:
    """Raise FlagError for the first invalid value or combination among the flags `args` has."""
    topology = topology_from_args(args) if hasattr(args, "backend") else None
    check_speculative(args, topology)
    if topology is not None:
        check_host_ranks(args, topology)
    check_tls(args, serves_grpc=hasattr(args, "grpc_reflection"))
    if topology is not None and topology.backend == "cpu" and args.devices:
        logger.warning("--devices %s has no effect with --backend cpu", ",".join(map(str, args.devices)))
    if getattr(args, "startup_timeout", 1.0) <= 0:
        raise FlagError(f"--startup-timeout {args.startup_timeout} must be positive")
    if getattr(args, "api_key", None) == "":
        raise FlagError("--api-key must not be empty (leave it out to serve without a key)")


def demo_default_model_dir() -> Path:
    """The trained demo model in the real V4 format, expanded on first use."""
    from services.demo.export import default_demo_model_dir

    return default_demo_model_dir()
