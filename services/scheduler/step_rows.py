"""One running request's part of a step plan: its NewSequence, its row, its grammar mask."""
from __future__ import annotations

from typing import Optional

from services.common.step_descriptors import GroupBlocks, NewSequence, ScheduledRow, TokenMask
from services.scheduler.kv_cache import KvCacheManager
from services.scheduler.requests import Request


def new_sequence(request: Request) -> NewSequence:
    """Sent in the first step of the request's sequence: every known token (prompt + outputs
    after a preemption), and how many of them the prefix cache already holds."""
    return NewSequence(
        seq_id=request.seq_id, partition_id=request.partition_id,
        prompt_token_ids=tuple(request.tokens_in_range(0, request.num_tokens)),
        logit_bias_token_ids=tuple(t for t, _ in request.logit_bias),
        logit_bias_values=tuple(b for _, b in request.logit_bias),
        request_id=request.correlation_id, num_cached_tokens=request.num_cached_tokens)


def scheduled_row(kv: KvCacheManager, request: Request, num_new: int,
                  mask: Optional[TokenMask]) -> ScheduledRow:
    """Allocate the blocks of `num_new` more positions; the row carries every block the workers
    do not know yet (a prefix hit's shared blocks in the sequence's first row)."""
    start = request.num_computed_tokens
    kv.allocate(request.seq_id, request.partition_id, start + num_new)
    blocks = tuple(GroupBlocks(group, first, tuple(ids))
                   for group, (first, ids) in kv.take_unsent(request.seq_id).items())
    append = request.tokens_in_range(request.num_known_tokens, request.num_tokens)
    request.num_known_tokens = request.num_tokens
    return ScheduledRow(
        seq_id=request.seq_id, num_computed_tokens=start, num_new_tokens=num_new,
        append_token_ids=tuple(append), new_blocks=blocks,
        sample=start + num_new == request.num_tokens, mask=mask,
        partition_id=request.partition_id)


def grammar_mask(request: Request) -> TokenMask:
    """The matcher's mask of the next token (raises what the matcher raises)."""
    row = request.matcher.mask()
    if row.allowed_token_ids is not None:
        return TokenMask(allowed_token_ids=tuple(row.allowed_token_ids))
    return TokenMask(bitmask=bytes(row.bitmask))
