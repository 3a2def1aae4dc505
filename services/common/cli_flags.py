"""The flags of every service and of the launcher, grouped by concern, and one parser per command.

The operators' flag names are the deployment guide's (api-contract.md "Starting the service"): the
launcher takes them all, each service the ones it uses.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from services.common.cli_values import (address, address_list, dtype_choice, device_list,
                                        generate_config, memory_size, non_negative_float,
                                        non_negative_int, path_list, positive_float, positive_int,
                                        rank_set, speculative_config)
from services.common.config import (DEFAULT_AUTH_EXEMPT_PATHS, GenerateDefaults, RequestBounds,
                                    SchemaBounds)

DEFAULT_FRONTEND_PORT = 8000
DEFAULT_SCHEDULER_PORT = 50051
DEFAULT_WORKER_PORT = 50061
LOCAL_HOST = "127.0.0.1"
# The gateway's API key when --api-key is not given (the flag wins).
API_KEY_ENV = "DSV4SERVE_API_KEY"


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


def _add_sequence_limit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-num-seqs", type=positive_int, default=8,
                   help="running requests per partition at most (a worker with a DSpark drafter "
                        "keeps its per-sequence windows for this many in --kv-cache-memory)")


def _add_scheduling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--long-prefill-token-threshold", type=non_negative_int, default=128,
                   help="prefill chunk size per request per step")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the cached blocks of identical prompt prefixes, at every block boundary "
                        "(on by default; --no-enable-prefix-caching computes every prompt in full)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="plan and send step N+1 while step N runs on the workers (on by default; "
                        "off with --speculative-config)")
    p.add_argument("--preempt-constrained", choices=("wait", "replay"), default="wait",
                   help="under cache pressure, constrained requests wait (default) or are preempted and "
                        "replay their committed output into a fresh grammar matcher on resume")


def _add_generate_defaults(p: argparse.ArgumentParser) -> None:
    p.add_argument("--generate-config", type=generate_config, default=GenerateDefaults(), metavar="JSON",
                   help='request defaults, JSON, e.g. \'{"max_new_tokens":2048,"temperature":0}\'')


def _add_request_bounds(p: argparse.ArgumentParser) -> None:
    bounds, schema = RequestBounds(), SchemaBounds()
    group = p.add_argument_group("request bounds (each overflow is a 4xx naming the field and the limit)")
    group.add_argument("--max-request-body-bytes", type=memory_size, default=bounds.max_request_body_bytes,
                       metavar="SIZE", help="larger bodies get 413 while being read (default 16MiB)")
    group.add_argument("--max-json-depth", type=positive_int, default=bounds.max_json_depth, metavar="N",
                       help=f"JSON nesting of a body or of tool-call arguments (default {bounds.max_json_depth})")
    group.add_argument("--max-tools", type=positive_int, default=bounds.max_tools, metavar="N",
                       help=f"tools in one request (default {bounds.max_tools})")
    group.add_argument("--max-schema-depth", type=positive_int, default=schema.max_depth, metavar="N",
                       help=f"nesting of a constrained request's schemas (default {schema.max_depth})")
    group.add_argument("--max-schema-nodes", type=positive_int, default=schema.max_nodes, metavar="N",
                       help=f"sub-schemas over a constrained request's schemas (default {schema.max_nodes})")
    group.add_argument("--max-schema-properties", type=positive_int, default=schema.max_properties,
                       metavar="N", help=f"properties over a constrained request's schemas "
                                         f"(default {schema.max_properties})")
    group.add_argument("--max-enum-values", type=positive_int, default=schema.max_enum_values, metavar="N",
                       help=f"enum entries over a constrained request's schemas (default {schema.max_enum_values})")
    group.add_argument("--max-schema-length", type=positive_int, default=schema.max_length_keyword,
                       metavar="N", help=f"largest minLength/maxLength/minItems/maxItems/minProperties/"
                                         f"maxProperties value (default {schema.max_length_keyword})")
    group.add_argument("--max-grammar-bytes", type=memory_size, default=schema.max_grammar_bytes,
                       metavar="SIZE", help="size of one request's tool-call grammar (default 4MiB)")


def _add_auth(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("authentication")
    group.add_argument("--api-key", default=None, metavar="KEY",
                       help=f"clients must send 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, "
                            "else no authentication)")
    group.add_argument("--auth-exempt-paths", type=path_list, default=DEFAULT_AUTH_EXEMPT_PATHS,
                       metavar="PATHS", help="paths served without the key, comma-separated "
                                             f"(default {','.join(DEFAULT_AUTH_EXEMPT_PATHS)}; '' for none)")


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


def _add_ops(p: argparse.ArgumentParser, grpc_server: bool) -> None:
    """TLS, logs and graceful stop: every service and the launcher."""
    group = p.add_argument_group("transport security, logs and stopping")
    group.add_argument("--tls-cert", type=Path, default=None, metavar="PEM",
                       help="this service's certificate: TLS on its gRPC server and the "
                            "certificate it presents to the gRPC services it calls")
    group.add_argument("--tls-key", type=Path, default=None, metavar="PEM", help="the key of --tls-cert")
    group.add_argument("--tls-ca", type=Path, default=None, metavar="PEM",
                       help="CA that signs every service's certificate: mutual TLS (servers require "
                            "and verify client certificates; clients verify the server)")
    if grpc_server:
        group.add_argument("--grpc-reflection", action=argparse.BooleanOptionalAction, default=True,
                           help="gRPC server reflection for grpcurl list/describe (default on)")
    group.add_argument("--shutdown-grace-s", type=non_negative_float, default=10.0, metavar="S",
                       help="on SIGTERM, seconds in-flight work may take to finish before it is "
                            "ended with an error (default 10)")
    group.add_argument("--log-format", choices=("text", "json"), default="text",
                       help="text lines or one JSON object per line (default text)")


def _add_backpressure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-waiting-requests", type=non_negative_int, default=512, metavar="N",
                   help="requests queued (waiting or grammar-pending) at most; more are refused "
                        "with 503 + Retry-After (default 512; 0: no bound)")


def _add_request_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--request-timeout-s", type=positive_float, default=None, metavar="S",
                   help="deadline of one generation; on expiry it is freed and the client gets 504 "
                        "(or an SSE error event) (default: none)")


def _add_npu_only(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("NPU-only settings (accepted for compatibility; ignored with a warning)")
    group.add_argument("--platform", default=None, metavar="NAME")
    group.add_argument("--ring-heap", default=None, metavar="SIZES")


def _add_host_ranks(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=rank_set, default=None, metavar="RANKS",
                   help="global ranks this worker drives, e.g. 0-7 (default: all dp×tp ranks)")
    p.add_argument("--dist-init-addr", type=address, default=None, metavar="HOST:PORT",
                   help="rendezvous of a world spread over several workers: the worker driving "
                        "rank 0 serves it, the others connect (needed with --ranks)")


def build_worker_parser(prog: str = "dsv4serve worker") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Worker: drives this host's ranks (Describe, Step).")
    _add_model(p, served_name=False)
    _add_topology(p)
    _add_host_ranks(p)
    _add_lengths(p)
    _add_sequence_limit(p)
    _add_worker_memory(p)
    _add_npu_only(p)
    _add_ops(p, grpc_server=True)
    _add_bind(p, LOCAL_HOST, DEFAULT_WORKER_PORT)
    return p


def build_scheduler_parser(prog: str = "dsv4serve scheduler") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Scheduler: request state, KV blocks, grammar state.")
    _add_model(p, served_name=True)
    p.add_argument("--workers", type=address_list, metavar="ADDRS", default=(f"{LOCAL_HOST}:{DEFAULT_WORKER_PORT}",),
                   help=f"worker addresses host:port,… (default {LOCAL_HOST}:{DEFAULT_WORKER_PORT})")
    _add_lengths(p)
    _add_sequence_limit(p)
    _add_scheduling(p)
    _add_backpressure(p)
    _add_generate_defaults(p)
    _add_npu_only(p)
    _add_ops(p, grpc_server=True)
    _add_bind(p, LOCAL_HOST, DEFAULT_SCHEDULER_PORT)
    return p


def build_frontend_parser(prog: str = "dsv4serve frontend") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Frontend: the OpenAI-compatible HTTP gateway.")
    _add_model(p, served_name=True)
    p.add_argument("--scheduler", type=address, metavar="ADDR", default=f"{LOCAL_HOST}:{DEFAULT_SCHEDULER_PORT}",
                   help=f"scheduler address host:port (default {LOCAL_HOST}:{DEFAULT_SCHEDULER_PORT})")
    _add_generate_defaults(p)
    _add_request_timeout(p)
    _add_request_bounds(p)
    _add_auth(p)
    _add_npu_only(p)
    _add_ops(p, grpc_server=False)
    _add_bind(p, LOCAL_HOST, DEFAULT_FRONTEND_PORT)
    return p


def build_stack_parser(prog: str = "dsv4serve stack") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Worker, scheduler and frontend as local processes.")
    _add_model(p, served_name=True)
    _add_topology(p)
    _add_lengths(p)
    _add_sequence_limit(p)
    _add_scheduling(p)
    _add_backpressure(p)
    _add_generate_defaults(p)
    _add_request_timeout(p)
    _add_worker_memory(p)
    _add_request_bounds(p)
    _add_auth(p)
    _add_npu_only(p)
    _add_ops(p, grpc_server=True)
    _add_bind(p, LOCAL_HOST, DEFAULT_FRONTEND_PORT)
    p.add_argument("--scheduler-port", type=non_negative_int, default=DEFAULT_SCHEDULER_PORT,
                   help=f"scheduler port on {LOCAL_HOST} (default {DEFAULT_SCHEDULER_PORT}; 0: a free port)")
    p.add_argument("--worker-port", type=non_negative_int, default=DEFAULT_WORKER_PORT,
                   help=f"worker port on {LOCAL_HOST} (default {DEFAULT_WORKER_PORT}; 0: a free port)")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds until the stack must be ready")
    p.add_argument("--log-dir", type=Path, default=None, metavar="DIR", help="write each service's output to DIR/<service>.log")
    p.add_argument("--ready-file", type=Path, default=None, metavar="PATH", help="write the addresses as JSON here once ready")
    p.add_argument("--restart-on-failure", action="store_true",
                   help="restart a child that exits on its own (at most 5 times in 10 minutes, "
                        "backoff 1, 2, 4, … 30 s) instead of stopping the stack")
    return p
