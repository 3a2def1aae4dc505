"""Command-line flags of every service and of the all-in-one launcher → frozen config objects.

The operators' flag names are the deployment guide's (api-contract.md "Starting the service"): the
launcher takes them all, each service the ones it uses. Every mistake is reported at startup by a
message that names the flag (argparse exits with status 2). Settings that only mean something on NPU
(`--platform`, `--ring-heap`, `PYPTO_*` variables) are accepted so the guide's command line runs, and
each one is named in a warning: ignored, but never silently.

The `*_argv` functions turn a config back into flags: the launcher starts its children with them, so
`parse_X_args(X_argv(cfg)) == cfg` (a test checks the round trip).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from services.common.config import (
    FrontendConfig,
    GenerateDefaults,
    SchedulerConfig,
    SpeculativeConfig,
    StackConfig,
    TopologyConfig,
    WorkerConfig,
)

logger = logging.getLogger(__name__)

DEFAULT_FRONTEND_PORT = 8000
DEFAULT_SCHEDULER_PORT = 50051
DEFAULT_WORKER_PORT = 50061
LOCAL_HOST = "127.0.0.1"
DSPARK_METHOD = "dspark"
DSPARK_BLOCK_SIZE = 32
NPU_ONLY_ENV_PREFIX = "PYPTO_"

ModelDirResolver = Callable[[], Path]


class FlagError(ValueError):
    """An invalid flag value or combination; the message starts with the flag's name."""


# ---- value parsers (argparse `type=`): their message follows "argument --flag:" ----

def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_size(text: str) -> int:
    """Bytes: `1073741824`, `512MiB`, `4GiB`, `2G` (binary multiples)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if match is None or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"must be a positive size such as 4GiB or 536870912, got {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def device_list(text: str) -> tuple[int, ...]:
    """`0,1,2,3` → (0, 1, 2, 3); ids are non-negative and distinct."""
    try:
        devices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated device ids such as 0,1,2,3, got {text!r}") from None
    if any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(f"device ids must be distinct and non-negative, got {text!r}")
    return devices


def address_list(text: str) -> tuple[str, ...]:
    """`host:port,host:port` → a tuple of addresses."""
    addresses = tuple(part.strip() for part in text.split(",") if part.strip())
    if not addresses:
        raise argparse.ArgumentTypeError("must list at least one host:port")
    return tuple(address(a) for a in addresses)


def address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"must be host:port, got {text!r}")
    return text


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON ({exc.msg} at position {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def speculative_config(text: str) -> SpeculativeConfig:
    """`{"method":"dspark","num_speculative_tokens":7}`; K = 0 means target-only decoding."""
    value = json_object(text)
    _reject_unknown_keys(value, {"method", "num_speculative_tokens"})
    method = value.get("method")
    if method != DSPARK_METHOD:
        raise argparse.ArgumentTypeError(f'"method" must be "{DSPARK_METHOD}", got {method!r}')
    k = value.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise argparse.ArgumentTypeError(f'"num_speculative_tokens" must be an integer >= 0, got {k!r}')
    return SpeculativeConfig(method=method, num_speculative_tokens=k)


def generate_config(text: str) -> GenerateDefaults:
    """`{"max_new_tokens":2048,"temperature":0}`: request defaults. Only greedy decoding exists."""
    value = json_object(text)
    _reject_unknown_keys(value, {"max_new_tokens", "temperature"})
    defaults = GenerateDefaults()
    max_new = value.get("max_new_tokens", defaults.max_new_tokens)
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1:
        raise argparse.ArgumentTypeError(f'"max_new_tokens" must be a positive integer, got {max_new!r}')
    temperature = value.get("temperature", defaults.temperature)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature != 0:
        raise argparse.ArgumentTypeError(
            f'"temperature" must be 0: only greedy decoding is supported, got {temperature!r}')
    return GenerateDefaults(max_new_tokens=max_new, temperature=float(temperature))


def _reject_unknown_keys(value: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(value) - known)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown key(s) {unknown}; known: {sorted(known)}")


def dtype_choice(text: str) -> Optional[str]:
    if text == "auto":
        return None
    if text not in ("float32", "bfloat16"):
        raise argparse.ArgumentTypeError(f"must be auto, float32 or bfloat16, got {text!r}")
    return text


# ---- flag groups ----

def _add_model(p: argparse.ArgumentParser, served_name: bool) -> None:
    p.add_argument("--model", type=Path, default=None, metavar="DIR",
                   help="checkpoint directory (DeepSeek-V4 format); default: the tiny random model, "
                        "generated on first use")
    if served_name:
        p.add_argument("--served-model-name", default=None, metavar="NAME",
                       help="model id clients send and /v1/models lists; default: the model directory's name")


def _add_bind(p: argparse.ArgumentParser, default_host: str, default_port: int) -> None:
    p.add_argument("--host", default=default_host, help=f"bind address (default {default_host})")
    p.add_argument("--port", type=non_negative_int, default=default_port,
                   help=f"listen port (default {default_port}; 0: a free port)")


def _add_lengths(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-size", type=positive_int, default=32, help="tokens per KV block (32 for DSpark)")
    p.add_argument("--max-model-len", type=positive_int, default=16384, help="prompt + output token limit")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=8192, help="token budget of one step")
    p.add_argument("--speculative-config", type=speculative_config, default=None, metavar="JSON",
                   help='JSON, e.g. \'{"method":"dspark","num_speculative_tokens":7}\'')


def _add_scheduling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-num-seqs", type=positive_int, default=8, help="running requests at most")
    p.add_argument("--long-prefill-token-threshold", type=non_negative_int, default=128,
                   help="prefill chunk size per request per step")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse cached KV blocks of identical prompt prefixes (accepted; not implemented "
                        "yet: every prompt is computed in full, with a warning)")


def _add_generate_defaults(p: argparse.ArgumentParser) -> None:
    p.add_argument("--generate-config", type=generate_config, default=GenerateDefaults(), metavar="JSON",
                   help='request defaults, JSON, e.g. \'{"max_new_tokens":2048,"temperature":0}\'')


def _add_topology(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="cpu", metavar="{cpu,cuda}", help="cpu or cuda")
    p.add_argument("--devices", type=device_list, default=(), metavar="IDS",
                   help="CUDA device ids, one per rank (default on cuda: 0..world-1)")
    p.add_argument("--dp", type=positive_int, default=1, help="data-parallel attention groups")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks per group")
    p.add_argument("--ep", type=positive_int, default=1, help="expert-parallel ranks (must divide dp×tp)")


def _add_worker_memory(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-blocks", type=positive_int, default=None,
                   help="blocks per block group per partition (default: from --kv-cache-memory)")
    p.add_argument("--kv-cache-memory", type=memory_size, default=1 << 30, metavar="SIZE",
                   help="KV cache bytes per partition, e.g. 4GiB (default 1GiB)")
    p.add_argument("--dtype", type=dtype_choice, default=None, metavar="{auto,float32,bfloat16}",
                   help="auto (float32 on cpu, bfloat16 on cuda), float32 or bfloat16")
    p.add_argument("--torch-threads", type=positive_int, default=1, metavar="N",
                   help="intra-op threads per CPU rank (default 1: best on small shared machines)")


def _add_npu_only(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("NPU-only settings (accepted for compatibility; ignored with a warning)")
    group.add_argument("--platform", default=None, metavar="NAME")
    group.add_argument("--ring-heap", default=None, metavar="SIZES")


def build_worker_parser(prog: str = "dsv4serve worker") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Worker: drives this host's ranks (Describe, Step).")
    _add_model(p, served_name=False)
    _add_topology(p)
    _add_lengths(p)
    _add_worker_memory(p)
    _add_npu_only(p)
    _add_bind(p, LOCAL_HOST, DEFAULT_WORKER_PORT)
    return p


def build_scheduler_parser(prog: str = "dsv4serve scheduler") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Scheduler: request state, KV blocks, grammar state.")
    _add_model(p, served_name=True)
    p.add_argument("--workers", type=address_list, metavar="ADDRS", default=(f"{LOCAL_HOST}:{DEFAULT_WORKER_PORT}",),
                   help=f"worker addresses host:port,… (default {LOCAL_HOST}:{DEFAULT_WORKER_PORT})")
    _add_lengths(p)
    _add_scheduling(p)
    _add_generate_defaults(p)
    _add_npu_only(p)
    _add_bind(p, LOCAL_HOST, DEFAULT_SCHEDULER_PORT)
    return p


def build_frontend_parser(prog: str = "dsv4serve frontend") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Frontend: the OpenAI-compatible HTTP gateway.")
    _add_model(p, served_name=True)
    p.add_argument("--scheduler", type=address, metavar="ADDR", default=f"{LOCAL_HOST}:{DEFAULT_SCHEDULER_PORT}",
                   help=f"scheduler address host:port (default {LOCAL_HOST}:{DEFAULT_SCHEDULER_PORT})")
    _add_generate_defaults(p)
    _add_npu_only(p)
    _add_bind(p, LOCAL_HOST, DEFAULT_FRONTEND_PORT)
    return p


def build_stack_parser(prog: str = "dsv4serve stack") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Worker, scheduler and frontend as local processes.")
    _add_model(p, served_name=True)
    _add_topology(p)
    _add_lengths(p)
    _add_scheduling(p)
    _add_generate_defaults(p)
    _add_worker_memory(p)
    _add_npu_only(p)
    _add_bind(p, LOCAL_HOST, DEFAULT_FRONTEND_PORT)
    p.add_argument("--scheduler-port", type=non_negative_int, default=DEFAULT_SCHEDULER_PORT,
                   help=f"scheduler port on {LOCAL_HOST} (default {DEFAULT_SCHEDULER_PORT}; 0: a free port)")
    p.add_argument("--worker-port", type=non_negative_int, default=DEFAULT_WORKER_PORT,
                   help=f"worker port on {LOCAL_HOST} (default {DEFAULT_WORKER_PORT}; 0: a free port)")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds until the stack must be ready")
    p.add_argument("--log-dir", type=Path, default=None, metavar="DIR", help="write each service's output to DIR/<service>.log")
    p.add_argument("--ready-file", type=Path, default=None, metavar="PATH", help="write the addresses as JSON here once ready")
    return p


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


def not_yet_implemented_warnings(args: argparse.Namespace) -> list[str]:
    """Operators' flags this release accepts but does not act on yet: said out loud, never silently."""
    messages = []
    if getattr(args, "enable_prefix_caching", None):
        messages.append("--enable-prefix-caching: prefix caching is not implemented yet; "
                        "every prompt is computed in full")
    speculative = getattr(args, "speculative_config", None)
    if speculative is not None and speculative.num_speculative_tokens > 0:
        messages.append(f"--speculative-config: {speculative.method} speculative decoding is not implemented "
                        f"yet; decoding runs target-only (K=0), which gives the same greedy tokens")
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
    """DSpark serves dp×tp attention with experts over every rank, in 32-token blocks."""
    spec = getattr(args, "speculative_config", None)
    if spec is None or spec.method != DSPARK_METHOD:
        return
    if args.block_size != DSPARK_BLOCK_SIZE:
        raise FlagError(f"--block-size {args.block_size}: --speculative-config method {DSPARK_METHOD} "
                        f"needs --block-size {DSPARK_BLOCK_SIZE}")
    if topology is not None and topology.ep != topology.world_size:
        raise FlagError(f"--ep {topology.ep}: --speculative-config method {DSPARK_METHOD} needs --ep equal to "
                        f"the world size --dp {topology.dp} × --tp {topology.tp} = {topology.world_size}")


def worker_config_from_args(args: argparse.Namespace, model_dir: Path) -> WorkerConfig:
    return WorkerConfig(
        model_dir=model_dir, host=args.host, port=args.port, topology=topology_from_args(args),
        block_size=args.block_size, max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens, num_blocks=args.num_blocks,
        kv_cache_memory_bytes=args.kv_cache_memory, dtype=args.dtype, speculative=args.speculative_config,
        torch_threads=args.torch_threads,
    )


def scheduler_config_from_args(args: argparse.Namespace, model_dir: Path,
                               worker_addresses: tuple[str, ...]) -> SchedulerConfig:
    return SchedulerConfig(
        model_dir=model_dir, served_model_name=args.served_model_name or model_dir.name,
        worker_addresses=worker_addresses, host=args.host, port=args.port,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold, block_size=args.block_size,
        enable_prefix_caching=bool(args.enable_prefix_caching), speculative=args.speculative_config,
        generate_defaults=args.generate_config,
    )


def frontend_config_from_args(args: argparse.Namespace, model_dir: Path, scheduler_address: str) -> FrontendConfig:
    return FrontendConfig(
        model_dir=model_dir, served_model_name=args.served_model_name or model_dir.name,
        scheduler_address=scheduler_address, host=args.host, port=args.port,
        generate_defaults=args.generate_config,
    )


def stack_config_from_args(args: argparse.Namespace, model_dir: Path) -> StackConfig:
    worker_args = argparse.Namespace(**{**vars(args), "host": LOCAL_HOST, "port": args.worker_port})
    scheduler_args = argparse.Namespace(**{**vars(args), "host": LOCAL_HOST, "port": args.scheduler_port})
    worker = worker_config_from_args(worker_args, model_dir)
    scheduler = scheduler_config_from_args(scheduler_args, model_dir, (f"{LOCAL_HOST}:{args.worker_port}",))
    frontend = frontend_config_from_args(args, model_dir, f"{LOCAL_HOST}:{args.scheduler_port}")
    return StackConfig(worker=worker, scheduler=scheduler, frontend=frontend,
                       startup_timeout_s=args.startup_timeout, log_dir=args.log_dir, ready_file=args.ready_file)


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
    for message in npu_only_warnings(args, os.environ if environ is None else environ):
        logger.warning(message)
    for message in not_yet_implemented_warnings(args):
        logger.warning(message)
    try:
        check_flags(args)
    except FlagError as exc:
        parser.error(str(exc))
    # Resolved only after every flag checked out: generating the default model takes a while.
    model_dir = args.model or (default_model_dir or tiny_default_model_dir)()
    return build(args, model_dir)


def check_flags(args: argparse.Namespace) -> None:
    """Raise FlagError for the first invalid value or combination among the flags `args` has."""
    topology = topology_from_args(args) if hasattr(args, "backend") else None
    check_speculative(args, topology)
    if topology is not None and topology.backend == "cpu" and args.devices:
        logger.warning("--devices %s has no effect with --backend cpu", ",".join(map(str, args.devices)))
    if getattr(args, "startup_timeout", 1.0) <= 0:
        raise FlagError(f"--startup-timeout {args.startup_timeout} must be positive")


def tiny_default_model_dir() -> Path:
    """The tiny random checkpoint in the real V4 format, generated on first use."""
    from services.worker.model.tiny_checkpoint import default_model_dir

    return default_model_dir()


# ---- config → argv (the launcher's children) ----

def worker_argv(cfg: WorkerConfig) -> list[str]:
    t = cfg.topology
    argv = ["--model", str(cfg.model_dir), "--backend", t.backend, "--dp", str(t.dp), "--tp", str(t.tp),
            "--ep", str(t.ep), *_length_flags(cfg.block_size, cfg.max_model_len, cfg.max_num_batched_tokens,
                                                cfg.speculative),
            "--kv-cache-memory", str(cfg.kv_cache_memory_bytes), "--torch-threads", str(cfg.torch_threads),
            "--host", cfg.host, "--port", str(cfg.port)]
    if t.devices:
        argv += ["--devices", ",".join(map(str, t.devices))]
    if cfg.num_blocks is not None:
        argv += ["--num-blocks", str(cfg.num_blocks)]
    if cfg.dtype is not None:
        argv += ["--dtype", cfg.dtype]
    return argv


def scheduler_argv(cfg: SchedulerConfig) -> list[str]:
    return ["--model", str(cfg.model_dir), "--served-model-name", cfg.served_model_name,
            "--workers", ",".join(cfg.worker_addresses),
            *_length_flags(cfg.block_size, cfg.max_model_len, cfg.max_num_batched_tokens, cfg.speculative),
            "--max-num-seqs", str(cfg.max_num_seqs),
            "--long-prefill-token-threshold", str(cfg.long_prefill_token_threshold),
            "--enable-prefix-caching" if cfg.enable_prefix_caching else "--no-enable-prefix-caching",
            "--generate-config", _generate_json(cfg.generate_defaults),
            "--host", cfg.host, "--port", str(cfg.port)]


def frontend_argv(cfg: FrontendConfig) -> list[str]:
    return ["--model", str(cfg.model_dir), "--served-model-name", cfg.served_model_name,
            "--scheduler", cfg.scheduler_address, "--generate-config", _generate_json(cfg.generate_defaults),
            "--host", cfg.host, "--port", str(cfg.port)]


def _length_flags(block_size: int, max_model_len: int, max_num_batched_tokens: int,
                  speculative: Optional[SpeculativeConfig]) -> list[str]:
    argv = ["--block-size", str(block_size), "--max-model-len", str(max_model_len),
            "--max-num-batched-tokens", str(max_num_batched_tokens)]
    if speculative is not None:
        argv += ["--speculative-config", json.dumps(
            {"method": speculative.method, "num_speculative_tokens": speculative.num_speculative_tokens})]
    return argv


def _generate_json(defaults: GenerateDefaults) -> str:
    return json.dumps({"max_new_tokens": defaults.max_new_tokens, "temperature": defaults.temperature})

