"""The flags of every service and of the launcher, grouped by concern, and one parser per command.

The operators' flag names are the deployment guide's (api-contract.md "Starting the service"): the
launcher takes them all, each service the ones it uses.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from services.common.cli_values import (address, address_list, dtype_choice, device_list,
                                        generate_config, memory_size, non_negative_int,
                                        positive_int, speculative_config)
from services.common.config import GenerateDefaults

DEFAULT_FRONTEND_PORT = 8000
DEFAULT_SCHEDULER_PORT = 50051
DEFAULT_WORKER_PORT = 50061
LOCAL_HOST = "127.0.0.1"


def _add_model(p: argparse.ArgumentParser, served_name: bool) -> None:
    p.add_argument("--model", type=Path, default=None, metavar="DIR",
                   help="checkpoint directory (DeepSeek-V4 format); default: the trained demo model, "
                        "expanded on first use")
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
