"""One running request's part of a step plan: its NewSequence, its row, its grammar mask."""
from __future__ import annotations

from typing import Optional

from services.common.step_descriptors import GroupBlocks, NewSequence, ScheduledRow, TokenMask
from services.scheduler.draft_window import NO_DRAFTS, DraftWindow, matcher_mask
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
                  mask: Optional[TokenMask], window: DraftWindow = NO_DRAFTS,
                  num_proposals: int = 0, allocate_to: int = 0, start: Optional[int] = None,
                  after_placeholder: bool = False) -> ScheduledRow:
    """Allocate the blocks of `num_new` more positions from `start` (default: the computed ones;
    and the draft window's, up to `allocate_to`); the row carries every block the workers do not
    know yet (a prefix hit's shared blocks in the sequence's first row). `after_placeholder`: the
    request's next token is still in flight (in_flight.py): the worker feeds it, the mask follows."""
    start = request.num_computed_tokens if start is None else start
    num_tokens = request.num_tokens
    total = num_tokens + after_placeholder
    seq_id = request.seq_id
    kv.allocate(seq_id, request.partition_id, max(start + num_new, allocate_to))
    unsent = kv.take_unsent(seq_id)
    blocks = tuple(GroupBlocks(group, first, tuple(ids))
                   for group, (first, ids) in unsent.items()) if unsent else ()
    append = request.tokens_in_range(request.num_known_tokens, num_tokens)
    request.num_known_tokens = total
    drafts = {} if window is NO_DRAFTS else dict(
        draft_token_ids=tuple(window.token_ids),
        draft_forced=tuple(window.forced) if window.num_forced else (),
        draft_masks=tuple(window.masks[1:]))
    # Positional: this runs per running request per step (bench/bench_scheduler.py).
    return ScheduledRow(seq_id, start, num_new, tuple(append), blocks, start + num_new == total,
                        mask, request.partition_id, num_proposals=num_proposals,
                        append_last_sampled=after_placeholder,
                        mask_follows=after_placeholder and request.matcher is not None, **drafts)


def grammar_mask(request: Request) -> TokenMask:
    """The matcher's mask of the next token (raises what the matcher raises)."""
    return matcher_mask(request.matcher)
