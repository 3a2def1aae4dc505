from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConstraintType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSTRAINT_TYPE_NONE: _ClassVar[ConstraintType]
    CONSTRAINT_TYPE_STRUCTURAL_TAG: _ClassVar[ConstraintType]
    CONSTRAINT_TYPE_JSON_SCHEMA: _ClassVar[ConstraintType]
    CONSTRAINT_TYPE_JSON_OBJECT: _ClassVar[ConstraintType]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]

class RequestPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_PHASE_UNSPECIFIED: _ClassVar[RequestPhase]
    REQUEST_PHASE_GRAMMAR_PENDING: _ClassVar[RequestPhase]
    REQUEST_PHASE_WAITING: _ClassVar[RequestPhase]
    REQUEST_PHASE_RUNNING: _ClassVar[RequestPhase]
    REQUEST_PHASE_FINISHED: _ClassVar[RequestPhase]
CONSTRAINT_TYPE_NONE: ConstraintType
CONSTRAINT_TYPE_STRUCTURAL_TAG: ConstraintType
CONSTRAINT_TYPE_JSON_SCHEMA: ConstraintType
CONSTRAINT_TYPE_JSON_OBJECT: ConstraintType
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
REQUEST_PHASE_UNSPECIFIED: RequestPhase
REQUEST_PHASE_GRAMMAR_PENDING: RequestPhase
REQUEST_PHASE_WAITING: RequestPhase
REQUEST_PHASE_RUNNING: RequestPhase
REQUEST_PHASE_FINISHED: RequestPhase

class LogitBias(_message.Message):
    __slots__ = ("token_id", "bias")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    bias: float
    def __init__(self, token_id: _Optional[int] = ..., bias: _Optional[float] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("type", "spec")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    type: ConstraintType
    spec: str
    def __init__(self, type: _Optional[_Union[ConstraintType, str]] = ..., spec: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "logit_bias", "ignore_eos")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    logit_bias: _containers.RepeatedCompositeFieldContainer[LogitBias]
    ignore_eos: bool
    def __init__(self, max_tokens: _Optional[int] = ..., logit_bias: _Optional[_Iterable[_Union[LogitBias, _Mapping]]] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "constraint")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    constraint: Constraint
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ...) -> None: ...

class Admitted(_message.Message):
    __slots__ = ("prompt_tokens", "max_tokens", "constrained", "max_tokens_capped")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_CAPPED_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    max_tokens: int
    constrained: bool
    max_tokens_capped: bool
    def __init__(self, prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., constrained: _Optional[bool] = ..., max_tokens_capped: _Optional[bool] = ...) -> None: ...

class TokenDelta(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("reason", "prompt_tokens", "completion_tokens", "hit_max_model_len")
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HIT_MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    hit_max_model_len: bool
    def __init__(self, reason: _Optional[_Union[FinishReason, str]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., hit_max_model_len: _Optional[bool] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("admitted", "tokens", "finished")
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    admitted: Admitted
    tokens: TokenDelta
    finished: Finished
    def __init__(self, admitted: _Optional[_Union[Admitted, _Mapping]] = ..., tokens: _Optional[_Union[TokenDelta, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("served_model_name", "max_model_len", "vocab_size", "eos_token_id", "block_size", "model_fingerprint", "constrained_decoding_available")
    SERVED_MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINED_DECODING_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    served_model_name: str
    max_model_len: int
    vocab_size: int
    eos_token_id: int
    block_size: int
    model_fingerprint: str
    constrained_decoding_available: bool
    def __init__(self, served_model_name: _Optional[str] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_id: _Optional[int] = ..., block_size: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., constrained_decoding_available: _Optional[bool] = ...) -> None: ...

class CheckReadyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("address", "connected", "error", "last_ok_age_ms")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_OK_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    address: str
    connected: bool
    error: str
    last_ok_age_ms: int
    def __init__(self, address: _Optional[str] = ..., connected: _Optional[bool] = ..., error: _Optional[str] = ..., last_ok_age_ms: _Optional[int] = ...) -> None: ...

class CheckReadyResponse(_message.Message):
    __slots__ = ("ready", "reason", "workers")
    READY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    reason: str
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    def __init__(self, ready: _Optional[bool] = ..., reason: _Optional[str] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ...) -> None: ...

class GetSchedulerStateRequest(_message.Message):
    __slots__ = ("include_requests",)
    INCLUDE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    include_requests: bool
    def __init__(self, include_requests: _Optional[bool] = ...) -> None: ...

class BlockGroupUsage(_message.Message):
    __slots__ = ("group", "total_blocks", "free_blocks", "used_blocks", "cached_blocks")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    group: str
    total_blocks: int
    free_blocks: int
    used_blocks: int
    cached_blocks: int
    def __init__(self, group: _Optional[str] = ..., total_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., used_blocks: _Optional[int] = ..., cached_blocks: _Optional[int] = ...) -> None: ...

class PartitionUsage(_message.Message):
    __slots__ = ("partition_id", "groups", "running_requests", "waiting_requests", "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    partition_id: int
    groups: _containers.RepeatedCompositeFieldContainer[BlockGroupUsage]
    running_requests: int
    waiting_requests: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_hit_rate: float
    def __init__(self, partition_id: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[BlockGroupUsage, _Mapping]]] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., prefix_cache_queries: _Optional[int] = ..., prefix_cache_hits: _Optional[int] = ..., prefix_cache_hit_rate: _Optional[float] = ...) -> None: ...

class RequestSummary(_message.Message):
    __slots__ = ("request_id", "phase", "partition_id", "prompt_tokens", "computed_tokens", "output_tokens", "constrained", "cached_tokens", "spec_verify_rows", "spec_drafted_tokens", "spec_accepted_tokens", "spec_forced_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINED_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPEC_VERIFY_ROWS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPEC_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPEC_FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    phase: RequestPhase
    partition_id: int
    prompt_tokens: int
    computed_tokens: int
    output_tokens: int
    constrained: bool
    cached_tokens: int
    spec_verify_rows: int
    spec_drafted_tokens: int
    spec_accepted_tokens: int
    spec_forced_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., phase: _Optional[_Union[RequestPhase, str]] = ..., partition_id: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., computed_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., constrained: _Optional[bool] = ..., cached_tokens: _Optional[int] = ..., spec_verify_rows: _Optional[int] = ..., spec_drafted_tokens: _Optional[int] = ..., spec_accepted_tokens: _Optional[int] = ..., spec_forced_tokens: _Optional[int] = ...) -> None: ...

class GetSchedulerStateResponse(_message.Message):
    __slots__ = ("num_waiting", "num_running", "num_grammar_pending", "num_live_matchers", "num_constrained_running", "partitions", "workers", "steps_total", "preemptions_total", "stall_rejections_total", "grammar_cache_entries", "requests", "prompt_tokens_total", "generation_tokens_total", "prefix_caching_enabled", "prefix_cache_queries_total", "prefix_cache_hits_total", "constrained_preemptions_total", "spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens", "spec_decode_num_accepted_tokens_per_pos", "spec_decode_num_forced_tokens", "num_live_draft_states", "step_seconds_total", "worker_forward_seconds_total", "spec_decode_num_draft_tokens_per_pos", "spec_decode_num_accepted_proposals_per_pos", "spec_decode_num_proposal_sets")
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_GRAMMAR_PENDING_FIELD_NUMBER: _ClassVar[int]
    NUM_LIVE_MATCHERS_FIELD_NUMBER: _ClassVar[int]
    NUM_CONSTRAINED_RUNNING_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    STEPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STALL_REJECTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_CACHE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHING_ENABLED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINED_PREEMPTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SPEC_DECODE_NUM_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DECODE_NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DECODE_NUM_ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DECODE_NUM_FORCED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_LIVE_DRAFT_STATES_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WORKER_FORWARD_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SPEC_DECODE_NUM_DRAFT_TOKENS_PER_POS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DECODE_NUM_ACCEPTED_PROPOSALS_PER_POS_FIELD_NUMBER: _ClassVar[int]
    SPEC_DECODE_NUM_PROPOSAL_SETS_FIELD_NUMBER: _ClassVar[int]
    num_waiting: int
    num_running: int
    num_grammar_pending: int
    num_live_matchers: int
    num_constrained_running: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionUsage]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    steps_total: int
    preemptions_total: int
    stall_rejections_total: int
    grammar_cache_entries: int
    requests: _containers.RepeatedCompositeFieldContainer[RequestSummary]
    prompt_tokens_total: int
    generation_tokens_total: int
    prefix_caching_enabled: bool
    prefix_cache_queries_total: int
    prefix_cache_hits_total: int
    constrained_preemptions_total: int
    spec_decode_num_drafts: int
    spec_decode_num_draft_tokens: int
    spec_decode_num_accepted_tokens: int
    spec_decode_num_accepted_tokens_per_pos: _containers.RepeatedScalarFieldContainer[int]
    spec_decode_num_forced_tokens: int
    num_live_draft_states: int
    step_seconds_total: float
    worker_forward_seconds_total: float
    spec_decode_num_draft_tokens_per_pos: _containers.RepeatedScalarFieldContainer[int]
    spec_decode_num_accepted_proposals_per_pos: _containers.RepeatedScalarFieldContainer[int]
    spec_decode_num_proposal_sets: int
    def __init__(self, num_waiting: _Optional[int] = ..., num_running: _Optional[int] = ..., num_grammar_pending: _Optional[int] = ..., num_live_matchers: _Optional[int] = ..., num_constrained_running: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionUsage, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., steps_total: _Optional[int] = ..., preemptions_total: _Optional[int] = ..., stall_rejections_total: _Optional[int] = ..., grammar_cache_entries: _Optional[int] = ..., requests: _Optional[_Iterable[_Union[RequestSummary, _Mapping]]] = ..., prompt_tokens_total: _Optional[int] = ..., generation_tokens_total: _Optional[int] = ..., prefix_caching_enabled: _Optional[bool] = ..., prefix_cache_queries_total: _Optional[int] = ..., prefix_cache_hits_total: _Optional[int] = ..., constrained_preemptions_total: _Optional[int] = ..., spec_decode_num_drafts: _Optional[int] = ..., spec_decode_num_draft_tokens: _Optional[int] = ..., spec_decode_num_accepted_tokens: _Optional[int] = ..., spec_decode_num_accepted_tokens_per_pos: _Optional[_Iterable[int]] = ..., spec_decode_num_forced_tokens: _Optional[int] = ..., num_live_draft_states: _Optional[int] = ..., step_seconds_total: _Optional[float] = ..., worker_forward_seconds_total: _Optional[float] = ..., spec_decode_num_draft_tokens_per_pos: _Optional[_Iterable[int]] = ..., spec_decode_num_accepted_proposals_per_pos: _Optional[_Iterable[int]] = ..., spec_decode_num_proposal_sets: _Optional[int] = ...) -> None: ...

class GetRequestStateRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class BlockTable(_message.Message):
    __slots__ = ("group", "block_ids", "released_prefix")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_PREFIX_FIELD_NUMBER: _ClassVar[int]
    group: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    released_prefix: int
    def __init__(self, group: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., released_prefix: _Optional[int] = ...) -> None: ...

class GetRequestStateResponse(_message.Message):
    __slots__ = ("summary", "prompt_token_ids", "output_token_ids", "block_tables", "grammar_status", "max_tokens")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TABLES_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_STATUS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    summary: RequestSummary
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    block_tables: _containers.RepeatedCompositeFieldContainer[BlockTable]
    grammar_status: str
    max_tokens: int
    def __init__(self, summary: _Optional[_Union[RequestSummary, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., output_token_ids: _Optional[_Iterable[int]] = ..., block_tables: _Optional[_Iterable[_Union[BlockTable, _Mapping]]] = ..., grammar_status: _Optional[str] = ..., max_tokens: _Optional[int] = ...) -> None: ...
