"""PartitionExecutor: diff-style rows → full runtime chunks, per-row validation, mask decoding."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from services.common.step_descriptors import (GroupBlocks, NewSequence, RowMask, ScheduledRow,
                                              StepMasks, StepPlan, TokenMask)
from services.worker.executor import PartitionExecutor
from services.worker.sequence_state import PartitionLimits
from services.worker.row_masks import RowError, decode_token_mask
from tests.worker_service.fake_runtime import FAKE_VOCAB_SIZE, FakeRuntime, fake_next_token

BLOCK_SIZE = 4
LIMITS = PartitionLimits(partition_id=0, vocab_size=FAKE_VOCAB_SIZE, block_size=BLOCK_SIZE,
                         num_blocks=16, block_groups=("window", "compressed"))
PROMPT = (11, 12, 13, 14, 15, 16)


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def executor(runtime: FakeRuntime) -> PartitionExecutor:
    return PartitionExecutor(runtime, LIMITS)


def new_blocks(compressed: tuple[int, ...], window: tuple[int, ...], first: int = 0,
               first_window: int = 0) -> tuple[GroupBlocks, ...]:
    return (GroupBlocks("compressed", first, compressed), GroupBlocks("window", first_window, window))


def prefill_row(seq_id: int, blocks: tuple[int, ...], **overrides) -> ScheduledRow:
    fields = dict(seq_id=seq_id, num_computed_tokens=0, num_new_tokens=len(PROMPT),
                  new_blocks=new_blocks(blocks, blocks), sample=True)
    fields.update(overrides)
    return ScheduledRow(**fields)


def bitmask_bytes(allowed: list[int], vocab_size: int = FAKE_VOCAB_SIZE) -> bytes:
    words = np.zeros((vocab_size + 31) // 32, dtype="<u4")
    for token in allowed:
        words[token // 32] |= np.uint32(1 << (token % 32))
    return words.tobytes()


class TestChunksFromDiffs:
    def test_prefill_then_decode_builds_full_chunks(self, executor, runtime):
        first = executor.execute(StepPlan(1, new_sequences=(NewSequence(5, 0, PROMPT),),
                                          rows=(prefill_row(5, (3, 7)),)))
        sampled = first.results[0].sampled_token_id
        assert sampled == fake_next_token(0, list(PROMPT))
        second = executor.execute(StepPlan(2, rows=(ScheduledRow(
            5, num_computed_tokens=6, num_new_tokens=1, append_token_ids=(sampled,),
            sample=True),)))
        chunk = runtime.steps[-1][0]
        assert (chunk.start_pos, chunk.token_ids) == (6, [sampled])
        assert chunk.block_tables == {"compressed": [3, 7], "window": [3, 7]}
        assert second.results[0].sampled_token_id == fake_next_token(6, [sampled])

    def test_chunked_prefill_takes_tokens_from_the_prompt(self, executor, runtime):
        executor.execute(StepPlan(1, new_sequences=(NewSequence(5, 0, PROMPT),),
                                  rows=(prefill_row(5, (2,), num_new_tokens=4, sample=False),)))
        result = executor.execute(StepPlan(2, rows=(ScheduledRow(
            5, num_computed_tokens=4, num_new_tokens=2, new_blocks=new_blocks((9,), (1,), 1, 1),
            sample=True),)))
        chunk = runtime.steps[-1][0]
        assert chunk.token_ids == list(PROMPT[4:])
        assert chunk.block_tables == {"compressed": [2, 9], "window": [2, 1]}
        assert result.results[0].sampled_token_id == fake_next_token(4, list(PROMPT[4:]))

    def test_forced_continuation_appends_several_tokens(self, executor, runtime):
        executor.execute(StepPlan(1, new_sequences=(NewSequence(5, 0, PROMPT),),
                                  rows=(prefill_row(5, (0, 1)),)))
        executor.execute(StepPlan(2, rows=(ScheduledRow(
            5, num_computed_tokens=6, num_new_tokens=3, append_token_ids=(40, 41, 42),
            new_blocks=new_blocks((2,), (2,), 2, 2), sample=True),)))
        chunk = runtime.steps[-1][0]
        assert (chunk.start_pos, chunk.token_ids) == (6, [40, 41, 42])

    def test_results_cover_sampled_and_failed_rows_in_request_order(self, executor):
        result = executor.execute(StepPlan(1, new_sequences=(NewSequence(1, 0, PROMPT),
                                                             NewSequence(2, 0, PROMPT)),
                                           rows=(prefill_row(1, (0, 1), sample=False),
                                                 prefill_row(404, (2, 3)),
                                                 prefill_row(2, (4, 5)))))
        assert [(r.seq_id, bool(r.error)) for r in result.results] == [(404, True), (2, False)]

    def test_logit_bias_reaches_sampled_rows(self, executor, runtime):
        biased = NewSequence(5, 0, PROMPT, (3, 9), (1.5, -2.0))
        executor.execute(StepPlan(1, new_sequences=(biased,),
                                  rows=(prefill_row(5, (0, 1)),)))
        ids, values = runtime.steps[-1][0].logit_bias
        assert ids.tolist() == [3, 9] and values.tolist() == [1.5, -2.0]


class TestRowErrors:
    @pytest.mark.parametrize("bad_row, message", [
        (ScheduledRow(77, 0, 6, sample=True), "unknown seq_id 77"),
        (prefill_row(5, (0, 1), num_computed_tokens=2, num_new_tokens=4), "non-contiguous"),
        (prefill_row(5, (0, 1), new_blocks=new_blocks((0,), (0, 1))), "missing compressed blocks"),
        (prefill_row(5, (0, 1), new_blocks=new_blocks((0, 1), (0,))), "missing window blocks"),
        (prefill_row(5, (0, 1), new_blocks=(GroupBlocks("ori", 0, (0, 1)),)),
         "unknown block group 'ori'"),
        (prefill_row(5, (0, 1), new_blocks=new_blocks((0, 1), (0, 1)) * 2), "listed twice"),
        (prefill_row(5, (0, 16)), "block id 16 is out of range"),
        (prefill_row(5, (0, 1), num_new_tokens=7), "only 6 tokens are known"),
        (prefill_row(5, (0, 1), append_token_ids=(FAKE_VOCAB_SIZE,)), "outside the vocabulary"),
        (prefill_row(5, (0, 1), mask=TokenMask()), "allows no token"),
    ])
    def test_bad_row_fails_alone_and_leaves_its_sequence_usable(self, executor, bad_row, message):
        new = (NewSequence(5, 0, PROMPT), NewSequence(6, 0, PROMPT))
        result = executor.execute(StepPlan(1, new_sequences=new,
                                           rows=(bad_row, prefill_row(6, (8, 9)))))
        assert message in result.results[0].error
        assert result.results[1].sampled_token_id == fake_next_token(0, list(PROMPT))
        if bad_row.seq_id == 5:  # nothing was committed: the correct row still runs
            retry = executor.execute(StepPlan(2, rows=(prefill_row(5, (0, 1)),)))
            assert retry.results[0].error == ""

    def test_rows_and_sequences_of_other_partitions_are_skipped(self, executor, runtime):
        result = executor.execute(StepPlan(1, new_sequences=[NewSequence(5, 3, PROMPT),
                                                             NewSequence(6, 0, PROMPT)],
                                           rows=[prefill_row(5, (0, 1), partition_id=3),
                                                 prefill_row(6, (2, 3))]))
        assert [r.seq_id for r in result.results] == [6]
        assert [chunk.seq_id for chunk in runtime.steps[-1]] == [6]
        assert executor.live_seq_ids == [6]


class TestSequenceLifetime:
    def test_finished_sequence_is_freed_before_rows_run(self, executor, runtime):
        executor.execute(StepPlan(1, new_sequences=(NewSequence(5, 0, PROMPT),),
                                  rows=(prefill_row(5, (0, 1)),)))
        result = executor.execute(StepPlan(2, finished_seq_ids=(5,),
                                           new_sequences=(NewSequence(5, 0, PROMPT),),
                                           rows=(prefill_row(5, (2, 3)),)))
        assert result.results[0].sampled_token_id == fake_next_token(0, list(PROMPT))
        assert runtime.steps[-1][0].block_tables == {"compressed": [2, 3], "window": [2, 3]}

    def test_reset_drops_every_sequence(self, executor, runtime):
        executor.execute(StepPlan(1, new_sequences=(NewSequence(5, 0, PROMPT),),
                                  rows=(prefill_row(5, (0, 1)),)))
        executor.reset()
        assert executor.live_seq_ids == []
        result = executor.execute(StepPlan(2, rows=(ScheduledRow(5, 6, 1, (3,), sample=True),)))
        assert "unknown seq_id 5" in result.results[0].error


class TestPrefixCacheHits:
    def test_sequence_starts_after_its_cached_prefix_with_the_shared_blocks(self, executor,
                                                                             runtime):
        """4 cached tokens (one block): the row computes from position 4; the window table gets a
        placeholder for logical block 0 when the hit shares only later window blocks."""
        cached = NewSequence(5, 0, PROMPT, num_cached_tokens=4)
        result = executor.execute(StepPlan(1, new_sequences=(cached,), rows=(ScheduledRow(
            5, num_computed_tokens=4, num_new_tokens=2,
            new_blocks=new_blocks((7, 8), (8,), first_window=1), sample=True),)))
        chunk = runtime.steps[-1][0]
        assert (chunk.start_pos, chunk.token_ids) == (4, list(PROMPT[4:]))
        assert chunk.block_tables == {"compressed": [7, 8], "window": [-1, 8]}
        assert result.results[0].sampled_token_id == fake_next_token(4, list(PROMPT[4:]))

    @pytest.mark.parametrize("new, row, message", [
        (NewSequence(5, 0, PROMPT, num_cached_tokens=6), prefill_row(5, (0, 1)),
         "leave nothing"),
        (NewSequence(5, 0, PROMPT, num_cached_tokens=4), prefill_row(5, (0, 1)),
         "non-contiguous"),
    ])
    def test_a_bad_cached_prefix_fails_its_row(self, executor, new, row, message):
        result = executor.execute(StepPlan(1, new_sequences=(new,), rows=(row,)))
        assert message in result.results[0].error

    def test_blocks_may_not_overwrite_the_table(self, executor):
        executor.execute(StepPlan(1, new_sequences=(NewSequence(5, 0, PROMPT),),
                                  rows=(prefill_row(5, (0, 1), num_new_tokens=4,
                                                    sample=False),)))
        result = executor.execute(StepPlan(2, rows=(ScheduledRow(
            5, num_computed_tokens=4, num_new_tokens=2, new_blocks=new_blocks((9,), (9,)),
            sample=True),)))
        assert "start at logical block 0, the table already has 2" in result.results[0].error


class TestMaskDecoding:
    def test_allowed_ids_become_int64_tensor(self):
        allowed, bitmask = decode_token_mask(TokenMask(allowed_token_ids=(4, 40, 400)), 1000)
        assert bitmask is None
        assert allowed.dtype == torch.int64 and allowed.tolist() == [4, 40, 400]

    def test_bitmask_bytes_become_little_endian_int32_words(self):
        mask = TokenMask(bitmask=bitmask_bytes([0, 31, 33, 999]))
        allowed, bitmask = decode_token_mask(mask, 1000)
        assert allowed is None and bitmask.dtype == torch.int32 and bitmask.shape == (32,)
        words = bitmask.tolist()
        set_bits = [32 * w + b for w in range(32) for b in range(32) if (words[w] >> b) & 1]
        assert set_bits == [0, 31, 33, 999]

    def test_refused_ids_become_words_allowing_every_other_token(self):
        allowed, bitmask = decode_token_mask(TokenMask(refused_token_ids=(0, 33, 999)), 1000)
        assert allowed is None and bitmask.dtype == torch.int32 and bitmask.shape == (32,)
        words = bitmask.tolist()
        clear_bits = [32 * w + b for w in range(32) for b in range(32) if not (words[w] >> b) & 1]
        assert clear_bits == [0, 33] + list(range(999, 1024))   # bits past the vocabulary: clear

    @pytest.mark.parametrize("mask, message", [
        (TokenMask(), "allows no token"),
        (TokenMask(refused_token_ids=tuple(range(1000))), "allows no token"),
        (TokenMask(refused_token_ids=(5, 1000)), "refuses id 1000, vocabulary has 1000"),
        (TokenMask(allowed_token_ids=(5,), refused_token_ids=(6,)), "more than one form"),
        (TokenMask(bitmask=bitmask_bytes([])), "allows no token"),
        # Bits past the vocabulary do not count as allowed tokens.
        (TokenMask(bitmask=np.array([0] * 31 + [1 << 31], dtype="<u4").tobytes()),
         "allows no token"),
        (TokenMask(bitmask=bytes(8)), "expected 128"),
        (TokenMask(allowed_token_ids=(5, 1000)), "vocabulary has 1000"),
        (TokenMask(allowed_token_ids=(5,), bitmask=bitmask_bytes([5])), "more than one form"),
    ])
    def test_invalid_masks_are_row_errors(self, mask, message):
        with pytest.raises(RowError, match=message):
            decode_token_mask(mask, 1000)

    def test_mask_reaches_the_runtime(self, executor):
        result = executor.execute(StepPlan(1, new_sequences=(NewSequence(5, 0, PROMPT),
                                                             NewSequence(6, 0, PROMPT)),
                                           rows=(prefill_row(5, (0, 1), mask=TokenMask((3, 17))),
                                                 prefill_row(6, (2, 3), mask=TokenMask(
                                                     bitmask=bitmask_bytes([8, 700]))))))
        assert [r.sampled_token_id for r in result.results] == [17, 700]


class TestMasksThatFollow:
    """Rows planned ahead: the forward runs first, the masks that follow are awaited to sample."""

    def late_plan(self, executor) -> StepPlan:
        executor.execute(StepPlan(1, new_sequences=tuple(NewSequence(s, 0, PROMPT) for s in (1, 2, 3)),
                                  rows=tuple(prefill_row(s, (2 * s, 2 * s + 1)) for s in (1, 2, 3))))
        return StepPlan(2, rows=tuple(ScheduledRow(s, 6, 1, append_token_ids=(40,), sample=True,
                                                   mask_follows=True) for s in (1, 2, 3)))

    def test_late_masks_constrain_sampling_after_the_forward(self, executor, runtime):
        plan = self.late_plan(executor)
        order: list[str] = []

        def await_masks() -> StepMasks:
            order.append(f"masks after {len(runtime.steps)} forwards")
            return StepMasks(2, (RowMask(1, TokenMask(allowed_token_ids=(5, 9))),
                                 RowMask(2, TokenMask(bitmask=bitmask_bytes([])))))

        result = executor.execute(plan, await_masks)
        assert order == ["masks after 2 forwards"]
        assert not runtime.steps[-1][0].sample  # the runtime left the late rows to the executor
        outcomes = [(r.seq_id, r.sampled_token_id, r.error) for r in result.results]
        assert outcomes[0] == (1, 9, "")
        assert outcomes[1][0] == 2 and "allows no token" in outcomes[1][2]
        assert outcomes[2][0] == 3 and "no mask followed" in outcomes[2][2]

    def test_a_discarded_row_samples_unmasked(self, executor):
        plan = self.late_plan(executor)
        result = executor.execute(plan, lambda: StepMasks(2, tuple(RowMask(s, discard=True)
                                                                   for s in (1, 2, 3))))
        assert all(r.sampled_token_id is not None and not r.error for r in result.results)

    def test_a_row_planned_ahead_is_fed_the_token_its_previous_row_sampled(self, executor,
                                                                           runtime):
        first = executor.execute(StepPlan(1, new_sequences=(NewSequence(1, 0, PROMPT),),
                                          rows=(prefill_row(1, (2, 3)),)))
        sampled = first.results[0].sampled_token_id
        second = executor.execute(StepPlan(2, rows=(ScheduledRow(
            1, 6, 1, append_token_ids=(21, 22), sample=True, append_last_sampled=True),)))
        chunk = runtime.steps[-1][0]
        assert (chunk.start_pos, chunk.token_ids) == (6, [sampled])
        assert second.results[0].sampled_token_id == fake_next_token(6, [sampled])
        third = executor.execute(StepPlan(3, rows=(ScheduledRow(
            1, 7, 2, new_blocks=new_blocks((4,), (4,), first=2, first_window=2), sample=True,
            append_last_sampled=True),)))
        assert not third.results[0].error
        assert runtime.steps[-1][0].token_ids == [21, 22]  # the fed token came before them

    def test_a_fed_token_is_fed_once(self, executor):
        executor.execute(StepPlan(1, new_sequences=(NewSequence(1, 0, PROMPT),),
                                  rows=(prefill_row(1, (2, 3)),)))
        fed = ScheduledRow(1, 6, 1, sample=False, append_last_sampled=True)
        assert not executor.execute(StepPlan(2, rows=(fed,))).results
        again = executor.execute(StepPlan(3, rows=(ScheduledRow(
            1, 7, 1, sample=True, append_last_sampled=True),)))
        assert "previous row sampled none" in again.results[0].error

    def test_a_row_whose_previous_row_sampled_nothing_fails_alone(self, executor):
        executor.execute(StepPlan(1, new_sequences=(NewSequence(1, 0, PROMPT),
                                                    NewSequence(2, 0, PROMPT)),
                                  rows=(prefill_row(1, (2, 3), sample=False),
                                        prefill_row(2, (4, 5)))))
        ahead = dict(num_computed_tokens=6, num_new_tokens=1, sample=True,
                     append_last_sampled=True)
        result = executor.execute(StepPlan(2, rows=(ScheduledRow(1, **ahead),
                                                    ScheduledRow(2, **ahead))))
        assert "previous row sampled none" in result.results[0].error
        assert not result.results[1].error and result.results[1].sampled_token_id is not None

    def test_a_failed_row_leaves_no_token_to_feed(self, executor):
        executor.execute(StepPlan(1, new_sequences=(NewSequence(1, 0, PROMPT),),
                                  rows=(prefill_row(1, (2, 3)),)))
        gap = executor.execute(StepPlan(2, rows=(ScheduledRow(
            1, 9, 1, sample=True, append_last_sampled=True),)))  # positions 6–8 skipped
        assert "non-contiguous" in gap.results[0].error
        retry = executor.execute(StepPlan(3, rows=(ScheduledRow(
            1, 6, 1, sample=True, append_last_sampled=True),)))
        assert "previous row sampled none" in retry.results[0].error
