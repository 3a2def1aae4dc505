"""Committing one sampled token to a request: grammar acceptance, forced continuation, stop checks.

Order matters: the matcher must accept the sampled token before anything is streamed (a refusal
fails only this request); EOS ends an unconstrained request unless `ignore_eos`, and a constrained
one only when the grammar has terminated; grammar-forced tokens are committed right after the
sampled token so the next row computes them together. EOS is counted in completion tokens but never
streamed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from services.scheduler.requests import FinishReason, Request, TokensEvent


class StopLimits(Protocol):
    max_model_len: int
    eos_token_id: int


@dataclass(frozen=True)
class CommitOutcome:
    finish: Optional[FinishReason] = None
    hit_max_model_len: bool = False
    error: Optional[str] = None  # the request must fail with INTERNAL


GOES_ON = CommitOutcome()  # the common outcome, built once (commit runs per row per step)


def commit_sampled_token(request: Request, token_id: int, limits: StopLimits,
                         grammar_forced: bool = True) -> CommitOutcome:
    """Commit, stream and stop-check; a matcher that raises fails only this request.
    `grammar_forced` False (benchmarks only): no forced run after the token."""
    try:
        return _commit(request, token_id, limits, grammar_forced)
    except Exception as error:  # a grammar bug must not take the batch down
        request.grammar_status = f"error: {error}"
        return CommitOutcome(error=f"grammar failed on token {token_id} for request "
                                   f"{request.request_id}: {error}")


def commit_verified(request: Request, first_pos: int, token_ids: list[int],
                    limits: StopLimits, grammar_forced: bool = True) -> CommitOutcome:
    """Commit a verified window's accepted drafts and bonus token (`token_ids`, the first at
    position `first_pos`) exactly as greedy decoding would have, one token at a time: a position a
    forced run already committed must hold the same token, and the first that does not (a forced
    run the window had to cut) ends the window there."""
    for offset, token_id in enumerate(token_ids):
        position = first_pos + offset
        if position < request.num_tokens:
            if request.tokens_in_range(position, position + 1) != [token_id]:
                return GOES_ON
            continue
        outcome = commit_sampled_token(request, token_id, limits, grammar_forced)
        if outcome.finish is not None or outcome.error is not None:
            return outcome
    return GOES_ON


def _commit(request: Request, token_id: int, limits: StopLimits,
            grammar_forced: bool) -> CommitOutcome:
    matcher = request.matcher
    if matcher is not None and not matcher.accept(token_id):
        request.grammar_status = f"error: refused token {token_id}"
        return CommitOutcome(error=f"grammar refused token {token_id} sampled for request "
                                   f"{request.request_id} (after {len(request.output_token_ids)} "
                                   f"output tokens)")
    request.output_token_ids.append(token_id)
    if token_id == limits.eos_token_id and _eos_stops(request):
        _note_grammar_state(request)
        return CommitOutcome(finish=FinishReason.STOP)
    new_tokens = (token_id,)
    if matcher is not None and grammar_forced and not matcher.is_terminated():
        room = _room_left(request, limits)
        forced = matcher.forced_tokens(room) if room > 0 else []
        request.output_token_ids.extend(forced)
        new_tokens += tuple(forced)
    request.emit(TokensEvent(new_tokens))
    if matcher is not None:
        _note_grammar_state(request)
    return _stop_after_tokens(request, limits)


def _eos_stops(request: Request) -> bool:
    if request.matcher is not None:
        return request.matcher.is_terminated()
    return not request.ignore_eos


def _room_left(request: Request, limits: StopLimits) -> int:
    return min(request.max_tokens - len(request.output_token_ids),
               limits.max_model_len - request.num_tokens)


def _note_grammar_state(request: Request) -> None:
    if request.matcher is not None and request.matcher.is_terminated():
        request.grammar_status = "terminated"


def _stop_after_tokens(request: Request, limits: StopLimits) -> CommitOutcome:
    hit_max_model_len = request.num_tokens >= limits.max_model_len
    if request.matcher is not None and request.matcher.is_terminated():
        return CommitOutcome(finish=FinishReason.STOP)
    if len(request.output_token_ids) >= request.max_tokens or hit_max_model_len:
        return CommitOutcome(finish=FinishReason.LENGTH, hit_max_model_len=hit_max_model_len)
    return GOES_ON
