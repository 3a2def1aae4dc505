"""The scheduler's side of speculative decoding: a sampled row's draft window, and what a verified
row commits.

A running request whose row samples gets a window of up to K tokens (draft_window.py) when it has
room for more than one token: `max_tokens` and `max_model_len` bound the window so a full
acceptance plus the bonus never exceeds them, and the step budget and free blocks bound it too
(no blocks, no drafts: speculation never preempts anyone). Blocks are allocated K positions past
the window so a chained drafter (MTP) can page its rows after the last accepted position.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from typing import Optional

from services.common.cli_values import DSPARK_METHOD
from services.common.config import SchedulerConfig, SpeculativeConfig
from services.common.step_descriptors import RowResult, ScheduledRow, TokenMask
from services.scheduler.draft_window import NO_DRAFTS, DraftWindow, build_window
from services.scheduler.kv_cache import KvCacheManager
from services.scheduler.requests import Request
from services.scheduler.step_rows import scheduled_row
from services.scheduler.token_commit import CommitOutcome, StopLimits, commit_verified


@dataclass
class SpecCounters:
    """vLLM's spec-decode counters (dsv4serve:spec_decode_*), plus forced drafts."""

    num_drafts: int = 0              # verify rows with at least one drafted token
    num_draft_tokens: int = 0        # drafted tokens verified
    num_accepted_tokens: int = 0     # of those, accepted
    num_forced_tokens: int = 0       # grammar-forced drafts sent
    accepted_per_pos: list[int] = field(default_factory=list)  # by draft index
    drafted_per_pos: list[int] = field(default_factory=list)   # verified, not forced, by index
    # The drafter's proposal sets checked against the tokens committed after them, and by index
    # within a set, the proposals equal to the committed token there and at every index before
    # (vLLM's per-position acceptance: grammar-forced tokens count where the drafter proposed
    # them, as it must in a stack whose grammar validates drafts but forces none).
    num_proposal_sets: int = 0
    proposed_per_pos: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SpecPolicy:
    num_speculative_tokens: int = 0   # K; 0: no speculation
    # False only in benchmarks: no grammar-forced tokens at all (neither in windows nor after the
    # sampled token), so the drafter must guess the structure (bench/bench_speculation.py).
    grammar_forced_drafts: bool = True


# A DSpark drafter rebuilds its context from the target's tap layers over the last sliding window
# (128 tokens on V4-Flash): a prefix hit leaves at least that many tokens to compute.
DSPARK_MIN_TOKENS_TO_COMPUTE = 128


def spec_policy(config: Optional[SpeculativeConfig]) -> SpecPolicy:
    return SpecPolicy(config.num_speculative_tokens if config is not None else 0)


def prefix_min_tokens(config: SchedulerConfig) -> int:
    spec = config.speculative
    if spec is not None and spec.method == DSPARK_METHOD and spec.num_speculative_tokens > 0:
        return max(config.prefix_min_tokens_to_compute, DSPARK_MIN_TOKENS_TO_COMPUTE)
    return config.prefix_min_tokens_to_compute


def room_for_tokens(request: Request, max_model_len: int) -> int:
    return min(request.max_tokens - len(request.output_token_ids),
               max_model_len - request.num_tokens)


def speculating(limits, request: Request, end: int) -> bool:
    """Speculation is on and a row ending at `end` samples with room for more than one token."""
    return (limits.speculation.num_speculative_tokens > 0 and end == request.num_tokens
            and room_for_tokens(request, limits.max_model_len) > 1)


def first_row(limits, kv: KvCacheManager, request: Request, num_new: int,
              mask: Optional[TokenMask]) -> ScheduledRow:
    """A new sequence's first row: no drafts yet, proposals when it samples."""
    end = request.num_computed_tokens + num_new
    if not speculating(limits, request, end):
        return scheduled_row(kv, request, num_new, mask)
    policy = limits.speculation
    return scheduled_row(kv, request, num_new, mask, num_proposals=policy.num_speculative_tokens,
                         allocate_to=blocks_to_allocate(policy, kv, request, end, NO_DRAFTS))


def speculative_row(limits, kv: KvCacheManager, request: Request, num_new: int, budget: int
                    ) -> ScheduledRow:
    """A sampled row with its draft window (raises what the matcher raises)."""
    policy = limits.speculation
    end = request.num_computed_tokens + num_new
    window = plan_window(policy, kv, request, end, budget - num_new, limits)
    return scheduled_row(kv, request, num_new, window.masks[0] if window.masks else None, window,
                         policy.num_speculative_tokens,
                         blocks_to_allocate(policy, kv, request, end, window))


def plan_window(policy: SpecPolicy, kv: KvCacheManager, request: Request, end: int, budget: int,
                limits: StopLimits) -> DraftWindow:
    """The draft window of a row that samples at position `end - 1` (raises what the matcher
    raises)."""
    k = policy.num_speculative_tokens
    max_drafts = min(k, room_for_tokens(request, limits.max_model_len) - 1, budget)
    if max_drafts > 0 and not kv.can_allocate(request.seq_id, request.partition_id,
                                              end + max_drafts + k):
        max_drafts = 0
    return build_window(request, max_drafts, limits.eos_token_id, policy.grammar_forced_drafts)


def blocks_to_allocate(policy: SpecPolicy, kv: KvCacheManager, request: Request, end: int,
                       window: DraftWindow) -> int:
    """Positions the row's blocks cover: the window, and K more when they fit."""
    wanted = end + len(window.token_ids) + policy.num_speculative_tokens
    if kv.can_allocate(request.seq_id, request.partition_id, wanted):
        return wanted
    return end + len(window.token_ids)


def commit_verified_row(request: Request, row: ScheduledRow, result: RowResult,
                        limits: StopLimits, counters: SpecCounters,
                        grammar_forced: bool = True) -> CommitOutcome:
    """Commit the accepted drafts and the bonus; keep the proposals for the next window."""
    first_pos = row.num_computed_tokens + row.num_new_tokens
    accepted = result.num_accepted_drafts
    _count(request, row, accepted, counters)
    tokens = list(row.draft_token_ids[:accepted]) + [result.sampled_token_id]
    outcome = commit_verified(request, first_pos, tokens, limits, grammar_forced)
    _count_proposals(request, counters)
    request.proposed_token_ids = list(result.proposed_token_ids)
    request.proposals_from = first_pos + accepted + 1
    return outcome


def _count(request: Request, row: ScheduledRow, accepted: int, counters: SpecCounters) -> None:
    forced = list(row.draft_forced) or [False] * len(row.draft_token_ids)
    drafted = [i for i, is_forced in enumerate(forced) if not is_forced]
    accepted_drafted = [i for i in drafted if i < accepted]
    for per_pos, positions in ((counters.accepted_per_pos, accepted_drafted),
                               (counters.drafted_per_pos, drafted)):
        per_pos.extend([0] * (len(forced) - len(per_pos)))
        for i in positions:
            per_pos[i] += 1
    counters.num_drafts += bool(drafted)
    counters.num_draft_tokens += len(drafted)
    counters.num_accepted_tokens += len(accepted_drafted)
    counters.num_forced_tokens += sum(forced)
    request.spec.verify_rows += bool(row.draft_token_ids)
    request.spec.drafted_tokens += len(drafted)
    request.spec.accepted_tokens += len(accepted_drafted)
    request.spec.forced_tokens += sum(forced)


def _count_proposals(request: Request, counters: SpecCounters) -> None:
    """The request's last proposals against the tokens committed since they were made: those
    grammar-forced after the bonus they followed, then this row's accepted drafts, bonus and
    forced run."""
    proposals = request.proposed_token_ids
    if not proposals:
        return
    end = min(request.num_tokens, request.proposals_from + len(proposals))
    committed = request.tokens_in_range(request.proposals_from, end)
    run = 0
    while run < len(committed) and committed[run] == proposals[run]:
        run += 1
    counters.num_proposal_sets += 1
    per_pos = counters.proposed_per_pos
    per_pos.extend([0] * (len(proposals) - len(per_pos)))
    for i in range(run):
        per_pos[i] += 1
