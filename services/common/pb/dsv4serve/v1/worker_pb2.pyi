from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JoinWorldRequest(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class JoinWorldResponse(_message.Message):
    __slots__ = ("round",)
    ROUND_FIELD_NUMBER: _ClassVar[int]
    round: int
    def __init__(self, round: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("scheduler_abi_version", "scheduler_build")
    SCHEDULER_ABI_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_BUILD_FIELD_NUMBER: _ClassVar[int]
    scheduler_abi_version: int
    scheduler_build: str
    def __init__(self, scheduler_abi_version: _Optional[int] = ..., scheduler_build: _Optional[str] = ...) -> None: ...

class Topology(_message.Message):
    __slots__ = ("world_size", "dp", "tp", "ep", "host_ranks", "backend")
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    EP_FIELD_NUMBER: _ClassVar[int]
    HOST_RANKS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    world_size: int
    dp: int
    tp: int
    ep: int
    host_ranks: _containers.RepeatedScalarFieldContainer[int]
    backend: str
    def __init__(self, world_size: _Optional[int] = ..., dp: _Optional[int] = ..., tp: _Optional[int] = ..., ep: _Optional[int] = ..., host_ranks: _Optional[_Iterable[int]] = ..., backend: _Optional[str] = ...) -> None: ...

class CacheFamily(_message.Message):
    __slots__ = ("name", "group", "rows_per_block", "bytes_per_block")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    name: str
    group: str
    rows_per_block: int
    bytes_per_block: int
    def __init__(self, name: _Optional[str] = ..., group: _Optional[str] = ..., rows_per_block: _Optional[int] = ..., bytes_per_block: _Optional[int] = ...) -> None: ...

class BlockGroup(_message.Message):
    __slots__ = ("name", "num_blocks", "bytes_per_block", "sliding_window")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_blocks: int
    bytes_per_block: int
    sliding_window: int
    def __init__(self, name: _Optional[str] = ..., num_blocks: _Optional[int] = ..., bytes_per_block: _Optional[int] = ..., sliding_window: _Optional[int] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("abi_version", "build_id", "model_fingerprint", "topology", "block_size", "vocab_size", "eos_token_id", "partition_ids", "block_groups", "cache_families", "max_num_batched_tokens", "compute_dtype", "world_round", "max_num_seqs", "instance_id")
    ABI_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUILD_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_GROUPS_FIELD_NUMBER: _ClassVar[int]
    CACHE_FAMILIES_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    WORLD_ROUND_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    abi_version: int
    build_id: str
    model_fingerprint: str
    topology: Topology
    block_size: int
    vocab_size: int
    eos_token_id: int
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    block_groups: _containers.RepeatedCompositeFieldContainer[BlockGroup]
    cache_families: _containers.RepeatedCompositeFieldContainer[CacheFamily]
    max_num_batched_tokens: int
    compute_dtype: str
    world_round: int
    max_num_seqs: int
    instance_id: int
    def __init__(self, abi_version: _Optional[int] = ..., build_id: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., topology: _Optional[_Union[Topology, _Mapping]] = ..., block_size: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_id: _Optional[int] = ..., partition_ids: _Optional[_Iterable[int]] = ..., block_groups: _Optional[_Iterable[_Union[BlockGroup, _Mapping]]] = ..., cache_families: _Optional[_Iterable[_Union[CacheFamily, _Mapping]]] = ..., max_num_batched_tokens: _Optional[int] = ..., compute_dtype: _Optional[str] = ..., world_round: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., instance_id: _Optional[int] = ...) -> None: ...

class NewSequence(_message.Message):
    __slots__ = ("seq_id", "partition_id", "prompt_token_ids", "logit_bias_token_ids", "logit_bias_values", "request_id", "num_cached_tokens")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_VALUES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    seq_id: int
    partition_id: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logit_bias_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logit_bias_values: _containers.RepeatedScalarFieldContainer[float]
    request_id: str
    num_cached_tokens: int
    def __init__(self, seq_id: _Optional[int] = ..., partition_id: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., logit_bias_token_ids: _Optional[_Iterable[int]] = ..., logit_bias_values: _Optional[_Iterable[float]] = ..., request_id: _Optional[str] = ..., num_cached_tokens: _Optional[int] = ...) -> None: ...

class TokenMask(_message.Message):
    __slots__ = ("allowed_token_ids", "bitmask", "refused_token_ids")
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BITMASK_FIELD_NUMBER: _ClassVar[int]
    REFUSED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bitmask: bytes
    refused_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, allowed_token_ids: _Optional[_Iterable[int]] = ..., bitmask: _Optional[bytes] = ..., refused_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GroupBlocks(_message.Message):
    __slots__ = ("group", "first_logical_block", "block_ids")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGICAL_BLOCK_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    group: str
    first_logical_block: int
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[str] = ..., first_logical_block: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ScheduledRow(_message.Message):
    __slots__ = ("seq_id", "partition_id", "num_computed_tokens", "num_new_tokens", "append_token_ids", "new_blocks", "sample", "mask", "draft_token_ids", "draft_forced", "draft_masks", "num_proposals", "append_last_sampled", "mask_follows")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    APPEND_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FORCED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MASKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    APPEND_LAST_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    MASK_FOLLOWS_FIELD_NUMBER: _ClassVar[int]
    seq_id: int
    partition_id: int
    num_computed_tokens: int
    num_new_tokens: int
    append_token_ids: _containers.RepeatedScalarFieldContainer[int]
    new_blocks: _containers.RepeatedCompositeFieldContainer[GroupBlocks]
    sample: bool
    mask: TokenMask
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_forced: _containers.RepeatedScalarFieldContainer[bool]
    draft_masks: _containers.RepeatedCompositeFieldContainer[TokenMask]
    num_proposals: int
    append_last_sampled: bool
    mask_follows: bool
    def __init__(self, seq_id: _Optional[int] = ..., partition_id: _Optional[int] = ..., num_computed_tokens: _Optional[int] = ..., num_new_tokens: _Optional[int] = ..., append_token_ids: _Optional[_Iterable[int]] = ..., new_blocks: _Optional[_Iterable[_Union[GroupBlocks, _Mapping]]] = ..., sample: _Optional[bool] = ..., mask: _Optional[_Union[TokenMask, _Mapping]] = ..., draft_token_ids: _Optional[_Iterable[int]] = ..., draft_forced: _Optional[_Iterable[bool]] = ..., draft_masks: _Optional[_Iterable[_Union[TokenMask, _Mapping]]] = ..., num_proposals: _Optional[int] = ..., append_last_sampled: _Optional[bool] = ..., mask_follows: _Optional[bool] = ...) -> None: ...

class RowMask(_message.Message):
    __slots__ = ("seq_id", "mask", "discard")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    DISCARD_FIELD_NUMBER: _ClassVar[int]
    seq_id: int
    mask: TokenMask
    discard: bool
    def __init__(self, seq_id: _Optional[int] = ..., mask: _Optional[_Union[TokenMask, _Mapping]] = ..., discard: _Optional[bool] = ...) -> None: ...

class StepMasks(_message.Message):
    __slots__ = ("step_id", "rows")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    rows: _containers.RepeatedCompositeFieldContainer[RowMask]
    def __init__(self, step_id: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[RowMask, _Mapping]]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("step_id", "new_sequences", "rows", "finished_seq_ids", "masks")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    MASKS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    new_sequences: _containers.RepeatedCompositeFieldContainer[NewSequence]
    rows: _containers.RepeatedCompositeFieldContainer[ScheduledRow]
    finished_seq_ids: _containers.RepeatedScalarFieldContainer[int]
    masks: StepMasks
    def __init__(self, step_id: _Optional[int] = ..., new_sequences: _Optional[_Iterable[_Union[NewSequence, _Mapping]]] = ..., rows: _Optional[_Iterable[_Union[ScheduledRow, _Mapping]]] = ..., finished_seq_ids: _Optional[_Iterable[int]] = ..., masks: _Optional[_Union[StepMasks, _Mapping]] = ...) -> None: ...

class RowResult(_message.Message):
    __slots__ = ("seq_id", "sampled_token_id", "error", "num_accepted_drafts", "proposed_token_ids")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    seq_id: int
    sampled_token_id: int
    error: str
    num_accepted_drafts: int
    proposed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seq_id: _Optional[int] = ..., sampled_token_id: _Optional[int] = ..., error: _Optional[str] = ..., num_accepted_drafts: _Optional[int] = ..., proposed_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("step_id", "results", "forward_ns", "error")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    results: _containers.RepeatedCompositeFieldContainer[RowResult]
    forward_ns: int
    error: str
    def __init__(self, step_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[RowResult, _Mapping]]] = ..., forward_ns: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...
