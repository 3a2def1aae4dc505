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
class TlsConfig:
    """gRPC transport security of one service (`--tls-cert/--tls-key/--tls-ca`); all None: plaintext.

    A service uses one identity for both directions: the scheduler presents `cert_file` to the
    frontends that call it and to the workers it calls. As a server, `cert_file` + `key_file` turn TLS
    on and `ca_file` makes it mutual (client certificates required and verified against the CA). As a
    client, any of the three turns TLS on: `ca_file` verifies the server (system roots otherwise) and
    `cert_file` + `key_file` are presented when the server asks for a client certificate.
    """

    cert_file: Optional[Path] = None
    key_file: Optional[Path] = None
    ca_file: Optional[Path] = None

    @property
    def serves_tls(self) -> bool:
        return self.cert_file is not None

    @property
    def dials_tls(self) -> bool:
        return self.cert_file is not None or self.ca_file is not None


@dataclass(frozen=True)
class OpsConfig:
    """What every service shares about running in production: transport, logs and stopping."""

    tls: TlsConfig = field(default_factory=TlsConfig)
    # gRPC server reflection (grpcurl `list`/`describe` without .proto files); servers only.
    grpc_reflection: bool = True
    # On SIGTERM, in-flight work gets this long to finish before it is ended with an error.
    shutdown_grace_s: float = 10.0
    log_format: str = "text"  # "text" or "json" (one JSON object per line)


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
    enable_prefix_caching: bool = True
    # Overlapped step loop: step N+1 is planned and sent while step N runs (step_pipeline.py).
    async_scheduling: bool = True
    # Cache pressure and constrained requests: "wait" (never preempted) or "replay" (preempted;
    # the matcher re-accepts the committed output on resume). See scheduler/memory_pressure.py.
    preempt_constrained: str = "wait"
    # A prefix-cache hit leaves at least this many tokens to compute (128 when DSpark rebuilds its
    # drafter context from them).
    prefix_min_tokens_to_compute: int = 1
    speculative: Optional[SpeculativeConfig] = None
    generate_defaults: GenerateDefaults = field(default_factory=GenerateDefaults)
    grammar_compile_threads: int = 2
    # A constrained request that cannot get blocks while nothing else can progress is rejected after
    # this long (seconds).
    stall_timeout_s: float = 5.0
    # Seconds between readiness round trips to the workers.
    worker_probe_interval_s: float = 1.0
    # Requests queued (waiting or grammar-pending) at most; beyond it new ones are refused with
    # UNAVAILABLE and a retry hint (the frontend's 503 + Retry-After). 0: no bound.
    max_waiting_requests: int = 512
    ops: OpsConfig = field(default_factory=OpsConfig)


@dataclass(frozen=True)
class WorkerConfig:
    model_dir: Path
    host: str = "127.0.0.1"
    port: int = 50061
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    block_size: int = 32
    max_model_len: int = 16384
    max_num_batched_tokens: int = 8192
    # Running sequences per partition at most: a DSpark drafter's per-sequence windows for this
    # many are taken from kv_cache_memory_bytes (the scheduler runs no more, see Describe).
    max_num_seqs: int = 8
    # Number of blocks per block group per partition; None: derived from kv_cache_memory_bytes.
    num_blocks: Optional[int] = None
    kv_cache_memory_bytes: int = 1 << 30
    # "float32" or "bfloat16"; None: float32 on CPU, bfloat16 on CUDA.
    dtype: Optional[str] = None
    speculative: Optional[SpeculativeConfig] = None
    # Intra-op threads of each CPU rank. 1 by default: on small CPU machines shared with the other
    # services, an OpenMP pool that spins for cores it does not get makes small GEMMs ~16× slower.
    torch_threads: int = 1
    # Global ranks this worker drives (`--ranks`); None: the whole world.
    ranks: Optional[tuple[int, ...]] = None
    # host:port of the world's TCPStore (`--dist-init-addr`), served by the worker driving rank 0;
    # needed when the world spans several workers. None: a free loopback port of this worker.
    dist_init_addr: Optional[str] = None

    ops: OpsConfig = field(default_factory=OpsConfig)

    @property
    def driven_ranks(self) -> tuple[int, ...]:
        return self.ranks if self.ranks is not None else tuple(range(self.topology.world_size))

    @property
    def drives_whole_world(self) -> bool:
        return self.driven_ranks == tuple(range(self.topology.world_size))


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
    # Deadline of one generation from its Generate call; None: none. On expiry the scheduler frees
    # the request and the client gets 504 (or an SSE error event when the stream had started).
    request_timeout_s: Optional[float] = None
    ops: OpsConfig = field(default_factory=OpsConfig)
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
    # Restart a child that exits on its own (capped, with backoff: see launcher.RestartPolicy)
    # instead of stopping the stack.
    restart_on_failure: bool = False
