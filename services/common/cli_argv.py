"""Config objects → flags: the launcher starts its children with these, so
`parse_X_args(X_argv(cfg), environ=X_env(cfg)) == cfg` (a test checks the round trip). The API key
travels in the environment, never on a command line other local users can read."""
from __future__ import annotations

import json
from typing import Optional

from services.common.cli_flags import API_KEY_ENV
from services.common.config import (FrontendConfig, GenerateDefaults, OpsConfig, RequestBounds,
                                    SchedulerConfig,
                                    SpeculativeConfig, WorkerConfig)


def worker_argv(cfg: WorkerConfig) -> list[str]:
    t = cfg.topology
    argv = ["--model", str(cfg.model_dir), "--backend", t.backend, "--dp", str(t.dp), "--tp", str(t.tp),
            "--ep", str(t.ep), *_length_flags(cfg.block_size, cfg.max_model_len, cfg.max_num_batched_tokens,
                                                cfg.speculative),
            "--max-num-seqs", str(cfg.max_num_seqs),
            "--kv-cache-memory", str(cfg.kv_cache_memory_bytes), "--torch-threads", str(cfg.torch_threads),
            "--host", cfg.host, "--port", str(cfg.port)]
    if t.devices:
        argv += ["--devices", ",".join(map(str, t.devices))]
    if cfg.num_blocks is not None:
        argv += ["--num-blocks", str(cfg.num_blocks)]
    if cfg.dtype is not None:
        argv += ["--dtype", cfg.dtype]
    if cfg.ranks is not None:
        argv += ["--ranks", ",".join(map(str, cfg.ranks))]
    if cfg.dist_init_addr is not None:
        argv += ["--dist-init-addr", cfg.dist_init_addr]
    return argv + ops_argv(cfg.ops, grpc_server=True)


def scheduler_argv(cfg: SchedulerConfig) -> list[str]:
    return ["--model", str(cfg.model_dir), "--served-model-name", cfg.served_model_name,
            "--workers", ",".join(cfg.worker_addresses),
            *_length_flags(cfg.block_size, cfg.max_model_len, cfg.max_num_batched_tokens, cfg.speculative),
            "--max-num-seqs", str(cfg.max_num_seqs),
            "--long-prefill-token-threshold", str(cfg.long_prefill_token_threshold),
            "--enable-prefix-caching" if cfg.enable_prefix_caching else "--no-enable-prefix-caching",
            "--async-scheduling" if cfg.async_scheduling else "--no-async-scheduling",
            "--preempt-constrained", cfg.preempt_constrained,
            "--generate-config", _generate_json(cfg.generate_defaults),
            "--max-waiting-requests", str(cfg.max_waiting_requests),
            "--host", cfg.host, "--port", str(cfg.port), *ops_argv(cfg.ops, grpc_server=True)]


def frontend_argv(cfg: FrontendConfig) -> list[str]:
    argv = ["--model", str(cfg.model_dir), "--served-model-name", cfg.served_model_name,
            "--scheduler", cfg.scheduler_address, "--generate-config", _generate_json(cfg.generate_defaults),
            *_bound_flags(cfg.bounds), "--auth-exempt-paths", ",".join(cfg.auth_exempt_paths),
            "--host", cfg.host, "--port", str(cfg.port), *ops_argv(cfg.ops, grpc_server=False)]
    if cfg.request_timeout_s is not None:
        argv += ["--request-timeout-s", repr(cfg.request_timeout_s)]
    return argv


def ops_argv(ops: OpsConfig, grpc_server: bool) -> list[str]:
    argv = ["--shutdown-grace-s", repr(ops.shutdown_grace_s), "--log-format", ops.log_format]
    for flag, path in (("--tls-cert", ops.tls.cert_file), ("--tls-key", ops.tls.key_file),
                       ("--tls-ca", ops.tls.ca_file)):
        if path is not None:
            argv += [flag, str(path)]
    if grpc_server:
        argv.append("--grpc-reflection" if ops.grpc_reflection else "--no-grpc-reflection")
    return argv


def frontend_env(cfg: FrontendConfig) -> dict[str, str]:
    """The environment that carries the frontend's API key (empty without one)."""
    return {API_KEY_ENV: cfg.api_key} if cfg.api_key is not None else {}


def _bound_flags(bounds: RequestBounds) -> list[str]:
    schema = bounds.schema
    values = {"--max-request-body-bytes": bounds.max_request_body_bytes,
              "--max-json-depth": bounds.max_json_depth, "--max-tools": bounds.max_tools,
              "--max-schema-depth": schema.max_depth, "--max-schema-nodes": schema.max_nodes,
              "--max-schema-properties": schema.max_properties,
              "--max-enum-values": schema.max_enum_values,
              "--max-schema-length": schema.max_length_keyword,
              "--max-grammar-bytes": schema.max_grammar_bytes}
    return [item for flag, value in values.items() for item in (flag, str(value))]


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
