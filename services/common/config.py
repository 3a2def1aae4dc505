"""Typed configuration of the three services.

Configuration flows one way: command-line flags → one of these frozen dataclasses → constructors.
Values only known at run time (block capacity, fingerprints) travel in RPC responses, never as edits
to these objects.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class SpeculativeConfig:
    """`--speculative-config '{"method":"dspark","num_speculative_tokens":7}'`; None when absent."""

    method: str
    num_speculative_tokens: int


@dataclass(frozen=True)
class GenerateDefaults:
    """`--generate-config '{"max_new_tokens":2048,"temperature":0}'`: request defaults."""

    max_new_tokens: int = 2048
    temperature: float = 0.0


@dataclass(frozen=True)
class TopologyConfig:
    backend: str = "cpu"  # "cpu" or "cuda"
    devices: tuple[int, ...] = ()
    dp: int = 1
    tp: int = 1
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp


@dataclass(frozen=True)
class SchedulerConfig:
    model_dir: Path
    served_model_name: str
    worker_addresses: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 50051
    max_model_len: int = 16384
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 128
    block_size: int = 32
    enable_prefix_caching: bool = False  # accepted; prefix caching is not implemented yet
    speculative: Optional[SpeculativeConfig] = None
    generate_defaults: GenerateDefaults = field(default_factory=GenerateDefaults)
    grammar_compile_threads: int = 2
    # A constrained request that cannot get blocks while nothing else can progress is rejected after
    # this long (seconds).
    stall_timeout_s: float = 5.0
    # Seconds between readiness round trips to the workers.
    worker_probe_interval_s: float = 1.0


@dataclass(frozen=True)
class WorkerConfig:
    model_dir: Path
    host: str = "127.0.0.1"
    port: int = 50061
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    block_size: int = 32
    max_model_len: int = 16384
    max_num_batched_tokens: int = 8192
    # Number of blocks per block group per partition; None: derived from kv_cache_memory_bytes.
    num_blocks: Optional[int] = None
    kv_cache_memory_bytes: int = 1 << 30
    # "float32" or "bfloat16"; None: float32 on CPU, bfloat16 on CUDA.
    dtype: Optional[str] = None
    speculative: Optional[SpeculativeConfig] = None
    # Intra-op threads of each CPU rank. 1 by default: on small CPU machines shared with the other
    # services, an OpenMP pool that spins for cores it does not get makes small GEMMs ~16× slower.
    torch_threads: int = 1


@dataclass(frozen=True)
class SchemaBounds:
    """The most grammar one constrained request may ask for, over all its schemas together (tool
    parameters and response_format). Each overflow is a 400 naming the field and the limit."""

    max_depth: int = 32              # nesting of sub-schemas (a tool's parameters object is 1)
    max_nodes: int = 8192            # sub-schemas
    max_properties: int = 1024       # declared properties
    max_enum_values: int = 4096      # entries of every `enum`
    max_length_keyword: int = 32768  # value of minLength, maxLength, minItems, ... (compile cost)
    max_grammar_bytes: int = 4 << 20  # the structural tag handed to the scheduler


@dataclass(frozen=True)
class RequestBounds:
    """The most work one HTTP request may cause before it is admitted (see README, Security)."""

    max_request_body_bytes: int = 16 << 20   # larger bodies get 413 while they are being read
    max_json_depth: int = 128                # nesting of the body (and of tool-call arguments)
    max_tools: int = 128
    schema: SchemaBounds = field(default_factory=SchemaBounds)


DEFAULT_AUTH_EXEMPT_PATHS = ("/health", "/metrics")


@dataclass(frozen=True)
class FrontendConfig:
    model_dir: Path
    served_model_name: str
    scheduler_address: str
    host: str = "127.0.0.1"
    port: int = 8000
    generate_defaults: GenerateDefaults = field(default_factory=GenerateDefaults)
    bounds: RequestBounds = field(default_factory=RequestBounds)
    # Clients must send `Authorization: Bearer <api_key>`; None: no authentication. Never printed.
    api_key: Optional[str] = field(default=None, repr=False)
    # Paths served without the key (exact matches).
    auth_exempt_paths: tuple[str, ...] = DEFAULT_AUTH_EXEMPT_PATHS


@dataclass(frozen=True)
class StackConfig:
    """`dsv4serve stack`: one worker, one scheduler and one frontend as local child processes.

    A port of 0 in any of the three configs means "pick a free port"; the launcher resolves it before
    starting anything and passes the chosen addresses down (to the scheduler's `worker_addresses` and
    the frontend's `scheduler_address`).
    """

    worker: WorkerConfig
    scheduler: SchedulerConfig
    frontend: FrontendConfig
    # Seconds the whole stack may take to become ready (worker, then scheduler, then frontend /health).
    startup_timeout_s: float = 300.0
    # Children's stdout/stderr go to <log_dir>/<service>.log; None: inherited from the launcher.
    log_dir: Optional[Path] = None
    # When set, the launcher writes {"base_url", "scheduler_address", "worker_address"} here once ready.
    ready_file: Optional[Path] = None
