"""One request's speculative window: the drafter's proposals walked through its grammar.

After a step the worker returns the drafter's proposals for the positions after the bonus token.
By the next step the scheduler has committed the bonus and any grammar-forced run after it, so the
proposals are first aligned (those for positions now committed are dropped; all of them when the
committed tokens disagree with them). The walk then takes proposals while the matcher accepts
them — cut at the first refused token, never past termination or EOS — and after every drafted
token appends the tokens the grammar forces there: they replace the drafter's guesses for those
positions and are accepted whenever the draft before them is (forced drafts). The matcher's mask
is read at every sampled position (the last known one and after each drafted token); the walk
rolls the matcher back, so only `token_commit` ever moves it for good.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from services.common.step_descriptors import TokenMask
from services.scheduler.requests import Request


@dataclass(frozen=True)
class DraftWindow:
    token_ids: list[int] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    # Constrained: the masks of the sampled positions (the last known one first); else empty.
    masks: list[TokenMask] = field(default_factory=list)

    @property
    def num_forced(self) -> int:
        return sum(self.forced)


NO_DRAFTS = DraftWindow()


def aligned_proposals(request: Request) -> list[int]:
    """The stored proposals for positions from `request.num_tokens` on ([] when misaligned)."""
    skip = request.num_tokens - request.proposals_from
    proposals = request.proposed_token_ids
    if not proposals or skip < 0 or request.tokens_in_range(request.proposals_from, request.num_tokens) \
            != proposals[:skip]:
        return []
    return proposals[skip:]


def build_window(request: Request, max_drafts: int, eos_token_id: int,
                 grammar_forced: bool = True) -> DraftWindow:
    """The window of at most `max_drafts` tokens after the request's known tokens."""
    proposals = aligned_proposals(request)[:max_drafts] if max_drafts > 0 else []
    if request.matcher is None:
        drafts = _until_eos(proposals, request, eos_token_id)
        return DraftWindow(drafts, [False] * len(drafts))
    return _walk(request, proposals, max_drafts, eos_token_id, grammar_forced)


def _until_eos(proposals: list[int], request: Request, eos_token_id: int) -> list[int]:
    """Unconstrained drafts end with the first EOS (nothing after it can be committed)."""
    if request.ignore_eos or eos_token_id not in proposals:
        return proposals
    return proposals[:proposals.index(eos_token_id) + 1]


def _walk(request: Request, proposals: list[int], max_drafts: int, eos_token_id: int,
          grammar_forced: bool) -> DraftWindow:
    matcher = request.matcher
    window = DraftWindow(masks=[matcher_mask(matcher)])
    accepted = 0
    try:
        index = 0
        while index < len(proposals) and len(window.token_ids) < max_drafts \
                and not matcher.is_terminated():
            token = proposals[index]
            if not matcher.accept(token):
                break
            accepted += 1
            window.token_ids.append(token)
            window.forced.append(False)
            index += 1
            if token == eos_token_id or matcher.is_terminated():
                # The request stops on this draft; the bonus after it is never committed.
                window.masks.append(TokenMask(allowed_token_ids=(eos_token_id,)))
                break
            if grammar_forced:
                forced = matcher.forced_tokens(max_drafts - len(window.token_ids))
                accepted += len(forced)
                window.token_ids.extend(forced)
                window.forced.extend([True] * len(forced))
                index += len(forced)
            window.masks.append(matcher_mask(matcher))
    finally:
        if accepted:
            matcher.rollback(accepted)
    return window


def matcher_mask(matcher) -> TokenMask:
    """The matcher's mask of its next token as a step-descriptor mask."""
    row = matcher.mask()
    if row.allowed_token_ids is not None:
        return TokenMask(allowed_token_ids=tuple(row.allowed_token_ids))
    if row.refused_token_ids is not None:
        return TokenMask(refused_token_ids=tuple(row.refused_token_ids))
    return TokenMask(bitmask=bytes(row.bitmask))
