"""The induction phase's data: random token strings from the trained vocabulary, copied token for
token, seeded, and its schedule continuing a state saved by the copy phase."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from services.demo import export
from services.demo.encode import SceneEncoder, contains_run
from services.demo.random_drills import MAX_TOKENS, MIN_TOKENS, RandomDrills
from services.demo.schedule import COPY, INDUCTION, SPAN, TrainSettings, continues
from services.demo.vocab import tie_structure


@pytest.fixture(scope="module")
def drills() -> RandomDrills:
    encoder = SceneEncoder()
    ids = load_file(str(export.COMPACT_DIR / "vocab.safetensors"))["ids"].to(torch.int64)
    return RandomDrills(tie_structure(ids.tolist(), encoder), encoder, seed=1)


def test_a_random_drill_completion_is_the_prompts_tokens_of_the_string_then_the_end(
        drills: RandomDrills) -> None:
    encoder = drills.encoder
    scene = encoder.scene(drills.scene(7, 40))
    eos = encoder.tokenizer.token_to_id("<｜end▁of▁sentence｜>")
    lengths = set()
    for item in scene.examples:
        copied = item.completion_ids[:-1]
        assert item.completion_ids[-1] == eos and all(item.key_tokens)
        assert encoder.tokenizer.decode(copied) == item.example.target["content"]
        # Token for token: the prompt holds the same ids, the first one with its leading space.
        first = encoder.tokenizer.id_to_token(copied[0])
        spaced = encoder.tokenizer.token_to_id("Ġ" + first)
        assert contains_run(item.prompt_ids, [spaced] + copied[1:])
        assert set(item.completion_ids) <= set(drills.pieces) | {eos}
        lengths.add(len(copied))
    assert min(lengths) >= MIN_TOKENS and max(lengths) <= MAX_TOKENS and len(lengths) > 3


def test_random_drills_are_a_pure_function_of_seed_split_and_index(drills: RandomDrills) -> None:
    assert drills.scene(3, 5) == drills.scene(3, 5)
    assert drills.scene(3, 5) != drills.scene(4, 5)
    held_out = {e.target["content"] for e in drills.scene(3, 40, held_out=True).examples}
    assert not held_out & {e.target["content"] for e in drills.scene(3, 40).examples}


def test_a_copy_phase_state_continues_into_the_induction_phase_on_its_own_schedule() -> None:
    """The induction run (docs/demo-model.md): a state of a 600-step copy phase at step 775
    continues when that phase is cut at 375 steps with its cosine kept over 600; a state whose
    steps ran on another schedule or other data does not."""
    saved = {k: v for k, v in vars(TrainSettings(copy_steps=600)).items()
             if k not in ("copy_cosine_steps", "induction_steps", "random_drills")}
    current = TrainSettings(copy_steps=375, copy_cosine_steps=600, induction_steps=300)
    assert continues(saved, current, 775)
    assert current.phase(774) == COPY and current.phase(775) == INDUCTION
    assert current.learning_rate_at(775) == current.induction_learning_rate / 10
    assert not continues(saved, TrainSettings(copy_steps=375, copy_cosine_steps=375), 775)
    assert not continues(saved, current, 776)
    assert not continues({**saved, "long_drills": 8}, current, 775)
    mixed = [i for i in range(775, 1075) if current.mixes_stream(i)]
    assert mixed[0] == 825 and len(mixed) == 125
    assert [current.random_calls_at(i) for i in (899, 900)] == [0, current.random_calls]
    assert TrainSettings().random_calls_at(950) == 0   # the default copy phase: no random calls


def test_a_repeat_drill_string_repeats_one_of_its_tokens_and_is_copied_token_for_token(
        drills: RandomDrills) -> None:
    scene = drills.encoder.scene(drills.scene(5, 40, repeats=True))
    long_ones = 0
    for item in scene.examples:
        copied = item.completion_ids[:-1]
        assert contains_run(item.prompt_ids, copied[1:])
        if len(copied) >= 3:
            long_ones += 1
            assert len(set(copied)) < len(copied), drills.encoder.tokenizer.decode(copied)
    assert long_ones > 20


def test_span_calls_draw_every_value_of_a_scene_from_a_few_shared_tokens(
        drills: RandomDrills) -> None:
    """Random calls' values have mostly distinct tokens; a span scene's values reuse a few."""
    def distinct_and_total(scene) -> tuple[int, int]:
        ids = [t for e in scene.examples for v in e.novel_values
               for t in drills.encoder.encode(" " + v)]
        return len(set(ids)), len(ids)

    shared, shared_total = distinct_and_total(drills.call_scene(3, 40, shared=True))
    spread, spread_total = distinct_and_total(drills.call_scene(3, 40))
    assert shared_total > 100 and spread_total > 100
    assert shared < shared_total / 3 and spread > spread_total / 2


def test_a_warm_started_span_phase_runs_on_its_own_warm_up_after_the_copy_phase() -> None:
    """The span run of docs/demo-model.md: the committed step-700 weights, the copy phase cut at
    300 of its planned 600 steps, then the span phase."""
    settings = TrainSettings(copy_steps=300, copy_cosine_steps=600, span_steps=400)
    assert settings.phase(699) == COPY and settings.phase(700) == SPAN
    warmup = settings.span_warmup_steps
    assert settings.learning_rate_at(700) == settings.span_learning_rate / warmup
    assert settings.total_steps == 1100
    saved = vars(settings)
    assert continues(saved, settings, 725)
    assert not continues({**saved, "span_calls": 4}, settings, 725)


def test_a_slash_share_puts_slash_merged_path_pieces_in_drills_copied_token_for_token(
        drills: RandomDrills) -> None:
    """The word-like pieces leave out "/data" and "/c"; with a slash share the drills copy them,
    and without one the drills are the stream the committed runs learnt from."""
    slash = set(drills.slash_pieces)
    assert {drills.encoder.tokenizer.token_to_id(t) for t in ("/data", "/c")} <= slash
    scene = drills.encoder.scene(drills.scene(6, 40, slash_share=0.25))
    copied = [item.completion_ids[:-1] for item in scene.examples]
    assert all(contains_run(item.prompt_ids, ids[1:]) for item, ids in zip(scene.examples, copied))
    assert sum(t in slash for ids in copied for t in ids) > 20
    assert not slash & {t for e in drills.encoder.scene(drills.scene(6, 40)).examples
                        for t in e.completion_ids}
    assert drills.scene(6, 40, slash_share=0.0) == drills.scene(6, 40)


def test_respelt_calls_start_every_string_with_a_word_the_call_spells_in_other_pieces(
        drills: RandomDrills) -> None:
    """` soup` in a request is `s`+`oup` after `">`: every string value of a respelt call scene
    starts with such a token, and the call's completion holds its other spelling."""
    encoder, respelt = drills.encoder, set(drills.respelt_firsts)
    assert encoder.tokenizer.token_to_id("Ġsoup") in respelt
    assert not respelt & set(drills.firsts)
    scene = drills.call_scene(5, 12, respelt=True)
    assert scene == drills.call_scene(5, 12, respelt=True) != drills.call_scene(5, 12)
    values = respelt_in_calls = 0
    for item in encoder.scene(scene).examples:
        for value in item.example.copy_values:
            first = encoder.encode(" " + value)[0]
            assert first in respelt
            spelling = encoder.encode(encoder.tokenizer.id_to_token(first)[1:])
            values += 1
            respelt_in_calls += contains_run(item.completion_ids, spelling)
    assert values >= 12 and respelt_in_calls == values
