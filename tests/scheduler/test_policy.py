"""Scheduling policy, driven with synthetic requests and a simulated worker: step budget, chunked
prefill, max_num_seqs, window release, stops, preemption by recompute, constrained requests never
preempted, stall rejection."""
from __future__ import annotations

import asyncio

from services.scheduler.errors import ErrorKind
from services.scheduler.requests import (ConstraintSpec, FailedEvent, FinishedEvent, FinishReason,
                                         RequestPhase)
from tests.scheduler.fake_grammar import FakeGrammarService
from tests.scheduler.fake_worker import EOS_TOKEN_ID
from tests.scheduler.policy_helpers import (BLOCK_SIZE, FakeClock, make_request, make_scheduler,
                                            reference_output, run_step, run_until_idle)

CONSTRAINT = ConstraintSpec("json_schema", "fake")


def finished(recorder) -> FinishedEvent:
    assert isinstance(recorder.events[-1], FinishedEvent), recorder.events[-1]
    return recorder.events[-1]


class TestStepBudget:
    def test_prefill_is_chunked_by_long_prefill_threshold(self):
        scheduler = make_scheduler(long_prefill_token_threshold=8)
        request, _ = make_request("a", list(range(2, 22)), max_tokens=2)
        scheduler.add(request)
        plans = [run_step(scheduler) for _ in range(3)]
        rows = [p.rows[0] for p in plans]
        assert [(r.num_computed_tokens, r.num_new_tokens, r.sample) for r in rows] == [
            (0, 8, False), (8, 8, False), (16, 4, True)]
        assert len(plans[0].new_sequences) == 1 and not plans[1].new_sequences

    def test_step_never_exceeds_max_num_batched_tokens(self):
        scheduler = make_scheduler(max_num_batched_tokens=10)
        for name in "abc":
            scheduler.add(make_request(name, list(range(2, 10)), max_tokens=3)[0])
        plans = run_until_idle(scheduler)
        assert max(p.num_tokens for p in plans) == 10
        assert plans[0].rows[0].num_new_tokens == 8 and plans[0].rows[1].num_new_tokens == 2

    def test_running_requests_capped_by_max_num_seqs(self):
        scheduler = make_scheduler(max_num_seqs=2)
        for name in "abc":
            scheduler.add(make_request(name, [5, 6, 7], max_tokens=4)[0])
        run_step(scheduler)
        assert len(scheduler.running) == 2 and len(scheduler.waiting) == 1

    def test_decode_rows_compute_one_token_with_the_last_sampled_one(self):
        scheduler = make_scheduler()
        request, recorder = make_request("a", [5, 6, 7], max_tokens=3)
        scheduler.add(request)
        run_step(scheduler)
        decode = run_step(scheduler).rows[0]
        assert (decode.num_computed_tokens, decode.num_new_tokens) == (3, 1)
        assert list(decode.append_token_ids) == recorder.streamed[:1] and decode.sample


class TestStops:
    def test_eos_stops_and_is_counted_but_not_streamed(self):
        scheduler = make_scheduler()
        request, recorder = make_request("a", [5, 6, 7], max_tokens=50)
        scheduler.add(request)
        while run_step(scheduler, eos_after=7) is not None:  # the prompt ends with 7: EOS at once
            pass
        assert request.output_token_ids == [EOS_TOKEN_ID]
        assert recorder.streamed == []
        assert finished(recorder) == FinishedEvent(FinishReason.STOP, 3, 1, False)

    def test_ignore_eos_keeps_generating_to_max_tokens(self):
        scheduler = make_scheduler()
        request, recorder = make_request("a", [5, 6, 7], max_tokens=4, ignore_eos=True)
        scheduler.add(request)
        while run_step(scheduler, eos_after=7) is not None:
            pass
        assert recorder.streamed[0] == EOS_TOKEN_ID and len(recorder.streamed) == 4
        assert finished(recorder).reason is FinishReason.LENGTH

    def test_max_tokens_finishes_with_length_and_the_reference_tokens(self):
        scheduler = make_scheduler()
        request, recorder = make_request("a", [5, 6, 7], max_tokens=6)
        scheduler.add(request)
        run_until_idle(scheduler)
        assert recorder.streamed == reference_output([5, 6, 7], 6)
        assert finished(recorder) == FinishedEvent(FinishReason.LENGTH, 3, 6, False)

    def test_reaching_max_model_len_reports_it(self):
        scheduler = make_scheduler(max_model_len=8)
        request, recorder = make_request("a", [5, 6, 7], max_tokens=5)
        scheduler.add(request)
        run_until_idle(scheduler)
        assert finished(recorder) == FinishedEvent(FinishReason.LENGTH, 3, 5, True)


class TestBlocks:
    def test_window_blocks_outside_the_window_are_released(self):
        scheduler = make_scheduler(sliding_window=8)
        request, _ = make_request("a", [5, 6, 7, 8], max_tokens=40)
        scheduler.add(request)
        peak_window = 0
        while run_step(scheduler) is not None:
            usage = {u.group: u.used_blocks for u in scheduler.kv.usage(0)}
            peak_window = max(peak_window, usage["window"])
            if request.seq_id is not None:
                table = scheduler.kv.sequence(request.seq_id).tables["window"]
                first_needed = max(0, request.num_computed_tokens - 8 + 1) // BLOCK_SIZE
                assert table.released_prefix <= first_needed
        # 8-token window + the block being written: never more than 3 blocks of 4 tokens.
        assert peak_window <= 3
        assert all(u.used_blocks == 0 for u in scheduler.kv.usage(0))

    def test_requests_spread_over_partitions(self):
        scheduler = make_scheduler(partitions=(0, 1))
        for name in "abcd":
            scheduler.add(make_request(name, [5, 6, 7], max_tokens=4)[0])
        run_step(scheduler)
        assert sorted(r.partition_id for r in scheduler.running) == [0, 0, 1, 1]

    def test_a_new_request_goes_to_the_partition_with_fewest_requests_then_most_free_blocks(self):
        scheduler = make_scheduler(partitions=(0, 1, 2))
        scheduler.kv.allocate(999, 1, 40)  # partition 1 has fewer free blocks than 0 and 2
        requests = [make_request(name, [5, 6, 7], max_tokens=4)[0] for name in "abcd"]
        for request in requests:
            scheduler.add(request)
        assert [r.partition_id for r in requests] == [0, 2, 1, 0]

    def test_limits_apply_to_each_partition(self):
        scheduler = make_scheduler(partitions=(0, 1), max_num_seqs=1, max_num_batched_tokens=3)
        for name in "abc":
            scheduler.add(make_request(name, [5, 6, 7], max_tokens=4)[0])
        plan = run_step(scheduler)
        assert sorted(row.partition_id for row in plan.rows) == [0, 1]
        assert plan.num_tokens == 6 and len(scheduler.waiting) == 1

    def test_everything_is_freed_when_requests_finish(self):
        scheduler = make_scheduler()
        for name in "abc":
            scheduler.add(make_request(name, list(range(2, 30)), max_tokens=9)[0])
        run_until_idle(scheduler)
        assert all(u.free_blocks == u.total_blocks for u in scheduler.kv.usage(0))


class TestPreemption:
    def test_unconstrained_request_is_preempted_and_recomputes_the_same_tokens(self):
        # 12 compressed blocks of 4 tokens: two 20-token sequences cannot both reach 24 tokens.
        scheduler = make_scheduler(num_blocks=12)
        prompt_a, prompt_b = list(range(2, 22)), list(range(30, 50))
        a, rec_a = make_request("a", prompt_a, max_tokens=8)
        b, rec_b = make_request("b", prompt_b, max_tokens=8)
        scheduler.add(a)
        scheduler.add(b)
        run_until_idle(scheduler)
        assert scheduler.counters.preemptions_total >= 1 and b.num_preemptions >= 1
        assert rec_a.streamed == reference_output(prompt_a, 8)
        assert rec_b.streamed == reference_output(prompt_b, 8)

    def test_constrained_request_is_never_preempted(self):
        grammar = FakeGrammarService(EOS_TOKEN_ID)
        scheduler = make_scheduler(num_blocks=12)
        older, rec_older = make_request("unconstrained", list(range(2, 22)), max_tokens=8)
        free_text = "[" + ",".join(["[3,4,5,6]"] * 8) + "]"
        younger, rec_younger = make_request(
            "constrained", list(range(30, 50)), max_tokens=8, constraint=CONSTRAINT,
            matcher=grammar.matcher(grammar_compiled(free_text)))
        scheduler.add(older)
        scheduler.add(younger)
        run_until_idle(scheduler)
        assert younger.num_preemptions == 0 and older.num_preemptions >= 1
        assert finished(rec_younger).completion_tokens == 8
        assert finished(rec_older).completion_tokens == 8
        assert grammar.live_matchers == 0

    def test_stalled_constrained_request_is_rejected_after_stall_timeout(self):
        grammar = FakeGrammarService(EOS_TOKEN_ID)
        clock = FakeClock()
        scheduler = make_scheduler(num_blocks=12, clock=clock, stall_timeout_s=5.0)
        free_text = "[" + ",".join(["[3,4,5,6]"] * 8) + "]"
        requests = [make_request(name, list(range(start, start + 20)), max_tokens=8,
                                 constraint=CONSTRAINT,
                                 matcher=grammar.matcher(grammar_compiled(free_text)))
                    for name, start in (("first", 2), ("second", 30))]
        for request, _ in requests:
            scheduler.add(request)
        while run_step(scheduler) is not None:
            pass
        (first, rec_first), (second, rec_second) = requests
        assert first.phase is second.phase is RequestPhase.RUNNING  # both blocked, none preempted
        assert scheduler.seconds_until_stall_deadline() == 5.0
        clock.now += 5.0
        run_until_idle(scheduler)
        assert rec_second.events[-1].kind is ErrorKind.RESOURCE_EXHAUSTED
        assert "stalled" in rec_second.events[-1].message
        assert finished(rec_first).completion_tokens == 8
        assert scheduler.counters.stall_rejections_total == 1
        assert scheduler.counters.preemptions_total == 0 and grammar.live_matchers == 0


class TestGrammar:
    def test_forced_tokens_are_streamed_with_the_sample_and_computed_in_one_row(self):
        grammar = FakeGrammarService(EOS_TOKEN_ID)
        scheduler = make_scheduler()
        request, recorder = make_request(
            "a", [5, 6, 7], max_tokens=20, constraint=CONSTRAINT,
            matcher=grammar.matcher(grammar_compiled("[[5, 6], [7], [8], [9, 10]]")))
        scheduler.add(request)
        first = run_step(scheduler)
        assert first.rows[0].mask.allowed_token_ids == (5, 6)
        assert recorder.events[0].token_ids[1:] == (7, 8)
        forced_row = run_step(scheduler).rows[0]
        assert forced_row.num_new_tokens == 3 and forced_row.append_token_ids[1:] == (7, 8)
        assert forced_row.mask.allowed_token_ids == (9, 10)
        run_until_idle(scheduler)
        assert request.output_token_ids[-1] == EOS_TOKEN_ID
        assert finished(recorder).reason is FinishReason.STOP
        assert request.grammar_status == "terminated" and grammar.live_matchers == 0

    def test_grammar_refusal_fails_only_that_request(self):
        grammar = FakeGrammarService(EOS_TOKEN_ID)
        scheduler = make_scheduler()
        bad, rec_bad = make_request("bad", [5, 6, 7], max_tokens=5, constraint=CONSTRAINT,
                                    matcher=grammar.matcher(grammar_compiled("refuse")))
        good, rec_good = make_request("good", [5, 6, 7], max_tokens=5)
        scheduler.add(bad)
        scheduler.add(good)
        run_until_idle(scheduler)
        failure = rec_bad.events[-1]
        assert isinstance(failure, FailedEvent) and failure.kind is ErrorKind.INTERNAL
        assert "grammar refused token" in failure.message
        assert finished(rec_good).completion_tokens == 5 and grammar.live_matchers == 0


    def test_matcher_that_raises_fails_only_its_request(self):
        grammar = FakeGrammarService(EOS_TOKEN_ID)
        scheduler = make_scheduler()
        broken_matcher = grammar.matcher(grammar_compiled("[[3]]"))
        broken_matcher.mask = lambda: 1 / 0
        broken, rec_broken = make_request("broken", [5, 6, 7], max_tokens=5,
                                          constraint=CONSTRAINT, matcher=broken_matcher)
        good, rec_good = make_request("good", [5, 6, 7], max_tokens=5)
        scheduler.add(broken)
        scheduler.add(good)
        run_until_idle(scheduler)
        assert rec_broken.events[-1].kind is ErrorKind.INTERNAL
        assert "grammar mask failed" in rec_broken.events[-1].message
        assert finished(rec_good).completion_tokens == 5 and grammar.live_matchers == 0


def grammar_compiled(spec: str):
    return asyncio.run(FakeGrammarService(EOS_TOKEN_ID).compile("json_schema", spec))
