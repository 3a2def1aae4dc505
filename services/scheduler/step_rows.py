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
    seq_id = request.seq_id
    end = start + num_new
    kv.allocate(seq_id, request.partition_id, end if end >= allocate_to else allocate_to)
    unsent = kv.take_unsent(seq_id)
    blocks = tuple(GroupBlocks(group, first, tuple(ids))
                   for group, (first, ids) in unsent.items()) if unsent else ()
    known = request.num_known_tokens
    append = tuple(request.tokens_in_range(known, num_tokens)) if known < num_tokens else ()
    total = num_tokens + after_placeholder
    request.num_known_tokens = total
    # Positional: this runs per running request per step (bench/bench_scheduler.py).
    drafts = _NO_DRAFT_FIELDS if window is NO_DRAFTS else _draft_fields(window)
    return ScheduledRow(seq_id, start, num_new, append, blocks, end == total, mask,
                        request.partition_id, *drafts, num_proposals, after_placeholder,
                        after_placeholder and request.matcher is not None)


def _draft_fields(window: DraftWindow) -> tuple[tuple, tuple, tuple]:
    """A row's draft_token_ids, draft_forced and draft_masks."""
    return (tuple(window.token_ids), tuple(window.forced) if window.num_forced else (),
            tuple(window.masks[1:]))


_NO_DRAFT_FIELDS: tuple[tuple, tuple, tuple] = ((), (), ())


def grammar_mask(request: Request) -> TokenMask:
    """The matcher's mask of the next token (raises what the matcher raises)."""
    return matcher_mask(request.matcher)
