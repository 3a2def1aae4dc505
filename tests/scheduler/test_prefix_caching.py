"""Prefix caching and memory pressure in the scheduler, driven step by step against the checking fake
worker (it verifies that every block a row reads holds exactly that sequence's tokens, and that no
shared block is written). Block size 4; groups: window (8 tokens), compressed, state (12 tokens)."""
from __future__ import annotations

import random

from services.common.step_descriptors import RowResult, StepResult
from services.scheduler.errors import ErrorKind
from services.scheduler.memory_pressure import ConstrainedPreemption
from services.scheduler.requests import ConstraintSpec, FailedEvent, FinishedEvent, Request
from tests.scheduler.fake_grammar import FakeGrammarService
from tests.scheduler.fake_worker import EOS_TOKEN_ID, FakeWorkerSpec
from tests.scheduler.policy_helpers import (make_cached_scheduler, make_request, reference_output,
                                            run_checked_step, run_checked_until_idle)
from tests.scheduler.test_policy import grammar_compiled

CONSTRAINT = ConstraintSpec("json_schema", "fake")


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 500) for _ in range(length)]


def first_new_sequence(plans, request: Request):
    return next(s for p in plans for s in p.new_sequences if s.request_id == request.request_id)


def serve(scheduler, worker, request: Request):
    scheduler.add(request)
    return run_checked_until_idle(scheduler, worker)


def all_free(scheduler) -> bool:
    return all(u.free_blocks == u.total_blocks and u.used_blocks == 0
               for pid in scheduler.kv.partition_ids for u in scheduler.kv.usage(pid))


class TestHits:
    def test_the_same_prompt_again_starts_from_its_cached_prefix_and_gives_the_same_output(self):
        scheduler, worker = make_cached_scheduler()
        tokens = prompt(1, 30)
        first, rec_first = make_request("first", tokens, max_tokens=5)
        second, rec_second = make_request("second", tokens, max_tokens=5)
        serve(scheduler, worker, first)
        plans = serve(scheduler, worker, second)
        assert first_new_sequence(plans, second).num_cached_tokens == 28
        assert plans[0].rows[0].num_computed_tokens == 28
        assert rec_second.streamed == rec_first.streamed == reference_output(tokens, 5)
        counters = scheduler.counters
        assert (counters.prefix_cache_queries_total, counters.prefix_cache_hits_total) == (60, 28)
        assert all_free(scheduler)

    def test_a_hit_always_leaves_a_token_to_compute(self):
        scheduler, worker = make_cached_scheduler()
        tokens = prompt(2, 32)  # eight full blocks
        serve(scheduler, worker, make_request("first", tokens, max_tokens=2)[0])
        again, _ = make_request("again", tokens, max_tokens=2)
        assert first_new_sequence(serve(scheduler, worker, again), again).num_cached_tokens == 28

    def test_min_tokens_to_compute_moves_the_hit_back(self):
        scheduler, worker = make_cached_scheduler(min_tokens_to_compute=9)
        tokens = prompt(3, 32)
        serve(scheduler, worker, make_request("first", tokens, max_tokens=2)[0])
        again, _ = make_request("again", tokens, max_tokens=2)
        assert first_new_sequence(serve(scheduler, worker, again), again).num_cached_tokens == 20

    def test_a_prompt_diverging_inside_the_last_aligned_block_hits_the_block_before(self):
        scheduler, worker = make_cached_scheduler()
        tokens = prompt(4, 30)
        serve(scheduler, worker, make_request("first", tokens, max_tokens=3)[0])
        diverged = tokens[:26] + [3, 3, 3, 3]
        third, rec_third = make_request("third", diverged, max_tokens=3)
        assert first_new_sequence(serve(scheduler, worker, third), third).num_cached_tokens == 24
        assert rec_third.streamed == reference_output(diverged, 3)

    def test_generated_tokens_are_cached_for_the_next_turn(self):
        scheduler, worker = make_cached_scheduler()
        tokens = prompt(5, 10)
        turn1, rec1 = make_request("turn1", tokens, max_tokens=12)
        serve(scheduler, worker, turn1)
        follow_up = tokens + rec1.streamed + [7, 8, 9]
        turn2, _ = make_request("turn2", follow_up, max_tokens=2)
        # 10 prompt + 12 generated tokens: 21 of them were computed, five full blocks.
        assert first_new_sequence(serve(scheduler, worker, turn2), turn2).num_cached_tokens == 20

    def test_no_hit_when_prefix_caching_is_off(self):
        scheduler, worker = make_cached_scheduler(prefix_caching=False)
        tokens = prompt(6, 30)
        serve(scheduler, worker, make_request("first", tokens, max_tokens=2)[0])
        again, _ = make_request("again", tokens, max_tokens=2)
        assert first_new_sequence(serve(scheduler, worker, again), again).num_cached_tokens == 0
        assert all(u.cached_blocks == 0 for u in scheduler.kv.usage(0))

    def test_concurrent_requests_sharing_a_prefix_read_the_same_blocks(self):
        """The second request starts while the first still decodes; shared blocks are read-only."""
        scheduler, worker = make_cached_scheduler()
        system = prompt(7, 24)
        a, rec_a = make_request("a", system + [5, 6, 7], max_tokens=8)
        scheduler.add(a)
        run_checked_step(scheduler, worker)
        b, rec_b = make_request("b", system + [9, 9], max_tokens=8)
        scheduler.add(b)
        plans = run_checked_until_idle(scheduler, worker)
        assert first_new_sequence(plans, b).num_cached_tokens == 24
        assert rec_a.streamed == reference_output(system + [5, 6, 7], 8)
        assert rec_b.streamed == reference_output(system + [9, 9], 8)


class TestPublishing:
    """A 30-token prompt is scheduled in one row; a probe with the same prompt looks for it."""

    def scheduled(self):
        scheduler, _ = make_cached_scheduler()
        tokens = prompt(8, 30)
        first, rec = make_request("first", tokens, max_tokens=2)
        scheduler.add(first)
        plan = scheduler.schedule()
        assert plan.rows[0].num_new_tokens == 30
        return scheduler, plan, first, rec, make_request("probe", tokens, max_tokens=2)[0]

    def test_blocks_are_published_only_after_the_worker_confirmed_the_step(self):
        scheduler, plan, first, _, probe = self.scheduled()
        assert scheduler.prefix.lookup(probe, 0).num_blocks == 0  # computed, not yet confirmed
        scheduler.commit(plan, StepResult(plan.step_id, (RowResult(first.seq_id, 9),)))
        assert scheduler.prefix.lookup(probe, 0).num_blocks == 7

    def test_a_failed_step_publishes_nothing(self):
        scheduler, _, first, _, probe = self.scheduled()
        scheduler.fail(first, ErrorKind.INTERNAL, "the step failed")  # what the step loop does
        assert scheduler.prefix.lookup(probe, 0).num_blocks == 0
        assert all_free(scheduler)

    def test_a_failed_row_publishes_nothing(self):
        scheduler, plan, first, rec, probe = self.scheduled()
        scheduler.commit(plan, StepResult(plan.step_id, (RowResult(first.seq_id, error="x"),)))
        assert isinstance(rec.events[-1], FailedEvent)
        assert scheduler.prefix.lookup(probe, 0).num_blocks == 0
        assert all_free(scheduler)


class TestMemoryPressure:
    def test_cached_blocks_are_evicted_before_any_request_is_preempted(self):
        spec = FakeWorkerSpec(num_blocks=16, num_window_blocks=16)
        scheduler, worker = make_cached_scheduler(spec)
        for i in range(6):
            serve(scheduler, worker, make_request(f"r{i}", prompt(10 + i, 40), max_tokens=4)[0])
        assert scheduler.counters.preemptions_total == 0
        assert scheduler.kv.usage(0)[1].cached_blocks > 0 and all_free(scheduler)

    def test_a_preempted_request_recomputes_from_its_cached_prefix(self):
        spec = FakeWorkerSpec(num_blocks=12, num_window_blocks=64)
        scheduler, worker = make_cached_scheduler(spec)
        a, rec_a = make_request("a", prompt(20, 20), max_tokens=8)
        b, rec_b = make_request("b", prompt(21, 20), max_tokens=8)
        scheduler.add(a)
        scheduler.add(b)
        plans = run_checked_until_idle(scheduler, worker)
        assert b.num_preemptions >= 1
        restarts = [s for p in plans for s in p.new_sequences if s.request_id == "b"][1:]
        assert restarts and all(s.num_cached_tokens > 0 for s in restarts)
        assert rec_a.streamed == reference_output(prompt(20, 20), 8)
        assert rec_b.streamed == reference_output(prompt(21, 20), 8)

    def test_a_long_prefill_that_fits_alone_shrinks_its_chunk_instead_of_failing(self):
        """Window groups of 4 blocks cannot hold a 40-token chunk at once; the request still runs."""
        spec = FakeWorkerSpec(num_blocks=64, num_window_blocks=4, state_window=0)
        scheduler, worker = make_cached_scheduler(spec)
        tokens = prompt(22, 40)
        request, rec = make_request("long", tokens, max_tokens=3)
        serve(scheduler, worker, request)
        assert isinstance(rec.events[-1], FinishedEvent)
        assert rec.streamed == reference_output(tokens, 3)

    def test_with_replay_a_preempted_constrained_request_gives_the_unpreempted_output(self):
        grammar = FakeGrammarService(EOS_TOKEN_ID)
        # A different token set at every position (one forced): a matcher at the wrong position
        # changes the output.
        compiled = grammar_compiled("[[3,4],[5,6],[7,8],[9],[11,12],[13,14],[15,16],[17,18]]")

        def constrained(name: str, start: int):
            request, rec = make_request(name, list(range(start, start + 20)), max_tokens=8,
                                        constraint=CONSTRAINT, matcher=grammar.matcher(compiled))
            request.matcher_factory = lambda: grammar.matcher(compiled)
            return request, rec

        alone, rec_alone = constrained("alone", 30)
        scheduler, worker = make_cached_scheduler(FakeWorkerSpec(num_blocks=64))
        serve(scheduler, worker, alone)

        spec = FakeWorkerSpec(num_blocks=12, num_window_blocks=64)
        scheduler, worker = make_cached_scheduler(
            spec, constrained_preemption=ConstrainedPreemption.REPLAY)
        older, rec_older = constrained("older", 2)
        younger, rec_younger = constrained("younger", 30)
        scheduler.add(older)
        scheduler.add(younger)
        plans = run_checked_until_idle(scheduler, worker)
        restarts = [s for p in plans for s in p.new_sequences if s.request_id == "younger"][1:]
        assert restarts and len(restarts[0].prompt_token_ids) > 20  # preempted mid-output
        assert scheduler.counters.constrained_preemptions_total >= 1
        assert rec_younger.streamed == rec_alone.streamed
        assert isinstance(rec_older.events[-1], FinishedEvent)
        assert grammar.live_matchers == 0 and all_free(scheduler)

    def test_many_requests_over_shared_prefixes_under_pressure_all_finish_exactly(self):
        # 80 blocks of 4 tokens: about ten of the 25..31-token prompts at once; preemptions happen.
        spec = FakeWorkerSpec(num_blocks=80, num_window_blocks=80)
        scheduler, worker = make_cached_scheduler(spec, max_num_seqs=16)
        prefixes = [prompt(100 + i, 24) for i in range(10)]
        requests = []
        for i in range(100):
            tokens = prefixes[i % 10] + prompt(1000 + i, 1 + i % 7)
            requests.append((tokens, *make_request(f"r{i}", tokens, max_tokens=6)))
        for _, request, _ in requests:
            scheduler.add(request)
        run_checked_until_idle(scheduler, worker)
        for tokens, _, rec in requests:
            assert rec.streamed == reference_output(tokens, 6)
        assert scheduler.counters.preemptions_total > 0
        assert scheduler.counters.prefix_cache_hits_total > 0 and all_free(scheduler)


class TestAbortStorm:
    def test_aborting_requests_at_random_steps_leaks_no_reference(self):
        scheduler, worker = make_cached_scheduler(FakeWorkerSpec(num_blocks=64,
                                                                 num_window_blocks=64))
        rng = random.Random(5)
        prefixes = [prompt(200 + i, 16) for i in range(5)]
        live: list[Request] = []
        for i in range(300):
            request, _ = make_request(f"s{i}", prefixes[i % 5] + prompt(300 + i, 3), max_tokens=20)
            scheduler.add(request)
            live.append(request)
            run_checked_step(scheduler, worker)
            while live and rng.random() < 0.6:
                scheduler.abort(live.pop(rng.randrange(len(live))))
        for request in live:
            scheduler.abort(request)
        run_checked_until_idle(scheduler, worker)
        assert all_free(scheduler)
        assert scheduler.kv.usage(0)[1].cached_blocks > 0


class TestPrefixAffinity:
    def two_partitions(self, **limits):
        return make_cached_scheduler(FakeWorkerSpec(partition_ids=(0, 1)), **limits)

    def test_a_request_goes_to_the_partition_holding_its_prefix(self):
        scheduler, worker = self.two_partitions()
        busy, _ = make_request("busy", prompt(40, 8), max_tokens=200)
        scheduler.add(busy)                      # partition 0
        system = prompt(41, 24)
        first, _ = make_request("first", system + [5], max_tokens=2)
        scheduler.add(first)                     # partition 1, the least loaded
        while first.phase.name != "FINISHED":
            run_checked_step(scheduler, worker)
        other, _ = make_request("other", prompt(42, 8), max_tokens=200)
        scheduler.add(other)                     # partition 1: loads are now 1 and 1
        follow, _ = make_request("follow", system + [6], max_tokens=2)
        scheduler.add(follow)
        assert (busy.partition_id, first.partition_id, other.partition_id) == (0, 1, 1)
        assert follow.partition_id == 1          # least loaded would have been partition 0
        run_checked_step(scheduler, worker)
        assert follow.num_cached_tokens == 24

    def test_a_full_partition_yields_to_the_least_loaded_one(self):
        scheduler, worker = self.two_partitions(max_num_seqs=1)
        system = prompt(43, 24)
        first, _ = make_request("first", system + [5], max_tokens=2)
        serve(scheduler, worker, first)
        blocker, _ = make_request("blocker", prompt(44, 8), max_tokens=50)
        scheduler.add(blocker)                   # equal loads: the lower id, the prefix holder
        assert first.partition_id == blocker.partition_id == 0
        follow, _ = make_request("follow", system + [6], max_tokens=2)
        scheduler.add(follow)
        assert follow.partition_id == 1          # the holder has no room for it now
