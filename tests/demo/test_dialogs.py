"""The synthetic conversations: rendered by the gateway's own chat format, typed arguments that
validate against the declared schemas, and a held-out split that shares nothing with training."""
from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from services.demo import fresh_values, lists, phrasing, values
from services.demo.dialogs import DialogGenerator
from services.demo.encode import SceneEncoder
from services.demo.evaluate import heldout_scenes
from services.demo.tools import CATALOG
from services.demo.vocab import (listed_name_vocabulary, scan_training, tie_structure,
                                 unspaced_s_vocabulary)
from services.frontend.dsml_parser import parse_completion


@pytest.fixture(scope="module")
def encoder() -> SceneEncoder:
    return SceneEncoder()


def test_held_out_lists_templates_and_invented_names_never_occur_in_training() -> None:
    for name, held in lists.HELDOUT.items():
        assert not set(lists.pool(name, True)) & set(lists.pool(name, False)), name
    assert not set(values.synthetic_names(True)) & set(values.synthetic_names(False))
    for spec in CATALOG:
        assert not set(spec.held_out) & set(spec.train), spec.name
        for param in spec.params:
            for value in param.phrases:
                assert not (set(param.phrase_options(value, True))
                            & set(param.phrase_options(value, False))), (spec.name, param.name)


def test_a_scene_is_a_pure_function_of_seed_and_index() -> None:
    first, again = DialogGenerator(5, False), DialogGenerator(5, False)
    assert first.scene(3, 4) == again.scene(3, 4)
    assert first.scene(3, 4) != first.scene(4, 4)


@pytest.mark.parametrize("held_out", [False, True])
def test_every_call_is_a_declared_tool_with_arguments_valid_for_its_schema(held_out: bool,
                                                                          encoder) -> None:
    generator = DialogGenerator(7, held_out, thinking_share=0.5)
    for index in range(30):
        scene = generator.scene(index, 4)
        declared = {t["function"]["name"]: t["function"]["parameters"] for t in scene.tools}
        for example in scene.examples:
            if example.kind != "call":
                continue
            name, arguments = example.expected_call
            jsonschema.validate(arguments, declared[name])
            assert json.loads(example.target["tool_calls"][0]["function"]["arguments"]) == arguments


def test_the_completion_parses_back_into_the_expected_call(encoder) -> None:
    """What the model learns to write is what the gateway's parser turns into the call."""
    generator = DialogGenerator(9, False, thinking_share=0.5)
    checked = 0
    for index in range(20):
        scene = generator.scene(index, 3)
        encoded = encoder.scene(scene)
        for item in encoded.examples:
            if item.example.kind != "call":
                continue
            text = encoder.tokenizer.decode(item.completion_ids, skip_special_tokens=False)
            parsed = parse_completion(text, item.example.thinking, scene.tools)
            (call,) = parsed.tool_calls
            assert (call.name, call.arguments) == item.example.expected_call
            checked += 1
    assert checked >= 20


def test_copied_values_are_tokenized_as_in_the_prompt(encoder) -> None:
    """`">Reykjavik` is spelled with the tokens of " Reykjavik" in the user message (first token
    without its space), so copying is token for token; the text is unchanged."""
    prompt = encoder.encode("<｜User｜>Weather in Reykjavik?<｜Assistant｜></think>")
    text = '<｜DSML｜parameter name="city" string="true">Reykjavik</｜DSML｜parameter>'
    ids = encoder.completion_ids(text, ["Reykjavik"], prompt)
    spaced = encoder.encode(" Reykjavik")
    start = ids.index(encoder.tokenizer.token_to_id('">')) + 1
    assert ids[start + 1:start + len(spaced)] == spaced[1:]
    assert encoder.tokenizer.id_to_token(ids[start]) == encoder.tokenizer.id_to_token(spaced[0])[1:]
    assert encoder.tokenizer.decode(ids, skip_special_tokens=False) == text


def test_held_out_prompts_share_no_value_with_the_training_stream(encoder) -> None:
    token_ids, training_values = scan_training(seed=1, scenes=12, examples=4)
    vocab = tie_structure(token_ids, encoder)
    scenes = heldout_scenes(vocab, encoder, 3, training_values)
    for scene in scenes:
        example = scene.examples[0].example
        assert not set(example.novel_values) & set(training_values)
        assert vocab.covers(scene.examples[0].completion_ids)


def test_key_tokens_are_the_tool_name_the_argument_values_and_the_token_closing_a_copy(
        encoder) -> None:
    """The copy phase weighs these up: an exact call needs every one of them."""
    scene = DialogGenerator(1, False).scene(0, 12)
    item = next(e for e in encoder.scene(scene).examples
                if e.example.kind == "call" and not e.example.thinking and e.example.copy_values)
    tokens = [encoder.tokenizer.decode([t], skip_special_tokens=False) for t in item.completion_ids]
    keys = "".join(t for t, key in zip(tokens, item.key_tokens) if key)
    name, _ = item.example.expected_call
    value = item.example.copy_values[0]
    assert name in keys and value + "</" in keys
    assert "<｜DSML｜tool_calls>" not in keys and "parameter name=" not in keys


def test_long_drills_copy_values_no_list_holds_and_no_held_out_name() -> None:
    generator = DialogGenerator(1, False)
    drills = generator.drill_scene(400, long_drills=24).examples
    assert len(drills) == 24
    listed = set(values.synthetic_names(False)) | set(lists.pool("city", False))
    for drill in drills:
        (value,) = drill.copy_values
        assert drill.target["content"] == value and value not in listed
        assert not set(value.split()) & set(values.synthetic_names(True))
    assert generator.training_scenes(400, 2, long_drills=3)[2].examples[0].copy_values
    assert len(generator.training_scenes(400, 2)) == 2


def test_fresh_values_are_drawn_anew_and_never_a_listed_or_held_out_one() -> None:
    """The fresh phase's values cannot be recalled: names are new at nearly every draw, dates
    and times vary in every digit, and none is an entry of either split's lists."""
    generator = DialogGenerator(1, False, fresh=True)
    rng = random.Random(3)
    cities = [generator.makers["city"](rng, False) for _ in range(300)]
    listed = {*lists.pool("city", False), *lists.pool("city", True), *values.synthetic_names(True),
              *values.synthetic_names(False)}
    assert len(set(cities)) > 290 and not set(cities) & listed
    dates = [generator.makers["date"](rng, False) for _ in range(300)]
    times = [generator.makers["clock_time"](rng, False) for _ in range(300)]
    assert len({d[:4] for d in dates}) > 20 and len({t[-2:] for t in times}) > 40
    tickers = {generator.makers["ticker"](rng, False) for _ in range(300)}
    assert len(tickers) > 250 and not tickers & set(lists.pool("ticker", True))
    with pytest.raises(ValueError):
        DialogGenerator(1, True, fresh=True)


def test_a_value_the_generator_refuses_is_drawn_again() -> None:
    picky = DialogGenerator(1, False, fresh=True, accepts=lambda value: "a" not in value)
    drills = picky.drill_scene(0).examples + picky.drill_scene(0, long_drills=8).examples
    assert sum("a" in d.copy_values[0] for d in drills) <= 2
    plain = DialogGenerator(1, False, fresh=True).drill_scene(0, long_drills=8).examples
    assert sum("a" in d.copy_values[0] for d in plain) >= 4


def test_framed_requests_keep_the_template_and_never_equal_a_held_out_one() -> None:
    rng = random.Random(5)
    for spec in CATALOG:
        for template in spec.train:
            for _ in range(20):
                framed = phrasing.framed(template, rng, spec.held_out)
                assert framed not in spec.held_out
                bare = template.rstrip(".?")
                assert bare in framed or bare[0].lower() + bare[1:] in framed
    every_frame = {f.format(v="look up {query} {safe}", V="Look up {query} {safe}")
                   for f in phrasing.IMPERATIVE}
    assert phrasing.framed("Look up {query} {safe}.", rng, every_frame) == "Look up {query} {safe}."
    generator = DialogGenerator(1, False, fresh=True, frames=True)
    requests = [e.messages[-1]["content"] for i in range(20) for e in generator.scene(i, 6).examples
                if e.kind == "call"]
    assert sum(r.startswith(("Could you", "Please", "Can you", "Hi!")) for r in requests) > 10


def test_long_values_hold_more_words_and_still_end_after_one_now_and_then() -> None:
    """The fresh phase's long variant: free-text values of 1–4 words, 2.7 on average."""
    def word_counts(generator: DialogGenerator) -> list[int]:
        rng = random.Random(7)
        return [len(generator.makers["words"](rng, False).split()) for _ in range(700)]

    long_counts = word_counts(DialogGenerator(1, False, fresh=True, long_values=True))
    plain_counts = word_counts(DialogGenerator(1, False, fresh=True))
    assert set(long_counts) == {1, 2, 3, 4} and max(plain_counts) == 3
    assert sum(long_counts) / 700 > 2.5 > 2.1 > sum(plain_counts) / 700
    with pytest.raises(ValueError):
        DialogGenerator(1, False, long_values=True)


def test_path_parts_put_listed_names_inside_fresh_paths() -> None:
    """With path parts, the training lists' directory names and file stems turn up after
    another component ("/srv/log"), where a listed path only ever came whole; without them the
    fresh makers are the plain ones."""
    def directories(generator: DialogGenerator) -> list[list[str]]:
        rng = random.Random(9)
        return [generator.makers["directory"](rng, False).strip("~./").split("/")
                for _ in range(300)]

    parts = set(fresh_values.path_parts()) - set(lists.pool("word", False))
    with_parts = directories(DialogGenerator(1, False, fresh=True, path_parts=True))
    plain = directories(DialogGenerator(1, False, fresh=True))
    assert sum(bool(set(d[1:]) & parts) for d in with_parts) > 40
    assert sum(bool(set(d[1:]) & parts) for d in plain) <= 2   # an invented name now and then
    assert {"data", "log", "config", "alice"} <= parts
    with pytest.raises(ValueError):
        DialogGenerator(1, False, path_parts=True)


def test_short_options_give_listed_commands_options_the_list_never_spells() -> None:
    """With short options, a share of fresh commands is a listed command's name with 1–2 option
    letters ("df -k"), options the training list never gives it; without them no command is."""
    def new_spellings(generator: DialogGenerator) -> list[str]:
        rng = random.Random(6)
        commands = [generator.makers["command"](rng, False) for _ in range(300)]
        listed = set(lists.pool("command", False))
        names = "|".join(fresh_values.command_names())
        return [c for c in commands
                if re.fullmatch(rf"({names}) -[a-z]{{1,2}}", c) and c not in listed]

    assert 60 < len(new_spellings(DialogGenerator(1, False, fresh=True, short_options=True))) < 120
    assert not new_spellings(DialogGenerator(1, False, fresh=True))
    with pytest.raises(ValueError):
        DialogGenerator(1, False, short_options=True)


def test_slash_ends_end_fresh_directories_and_paths_with_a_slash_merged_piece(
        encoder: SceneEncoder) -> None:
    """With slash ends, a share of fresh directories and paths end with a piece BPE merges with
    the slash before it ("/srv/log/config" ends in `/config`), as the held-out /srv/data does;
    without them a path ends with a file name, and a directory with such a piece less often."""
    def slash_ended(generator: DialogGenerator, kind: str) -> int:
        rng = random.Random(7)
        made = [generator.makers[kind](rng, False) for _ in range(300)]
        last = [encoder.tokenizer.id_to_token(encoder.encode(" " + m)[-1]) for m in made]
        return sum(bool(re.fullmatch(r"/[a-z]+", token)) for token in last)

    ends = DialogGenerator(1, False, fresh=True, path_parts=True, slash_ends=True)
    plain = DialogGenerator(1, False, fresh=True, path_parts=True)
    assert slash_ended(plain, "path") == 0 and 100 < slash_ended(ends, "path") < 160
    assert slash_ended(ends, "directory") > 2 * slash_ended(plain, "directory") + 30
    assert {"data", "config", "log"} <= set(fresh_values.slash_end_words())
    with pytest.raises(ValueError):
        DialogGenerator(1, False, slash_ends=True)


def test_letter_starts_start_free_text_values_with_a_one_letter_piece(
        encoder: SceneEncoder) -> None:
    """With letter starts, a share of free-text values start with a word the call spells from a
    one-letter piece (` soup` in the request, `s`+`oup` after `">`), `s` among them, and keep
    their other words."""
    def letter_started(generator: DialogGenerator, kind: str) -> list[str]:
        rng = random.Random(7)
        made = [generator.makers[kind](rng, False) for _ in range(300)]
        return [m for m in made
                if len(encoder.tokenizer.encode(m, add_special_tokens=False).tokens[0]) == 1]

    starts = DialogGenerator(1, False, fresh=True, letter_starts=True)
    plain = DialogGenerator(1, False, fresh=True)
    for kind in fresh_values.LOWER_CASE_TEXT_KINDS:
        assert len(letter_started(starts, kind)) > len(letter_started(plain, kind)) + 50
    sentences = [len(s.split()) for s in letter_started(starts, "sentence")]
    assert min(sentences) >= 3 and any(s.startswith("s") for s in letter_started(starts, "words"))
    assert {"soup", "gym"} <= set(fresh_values.letter_start_words())
    with pytest.raises(ValueError):
        DialogGenerator(1, False, letter_starts=True)


def test_s_starts_raise_the_share_of_values_started_by_an_s_word() -> None:
    """With `s_starts`, that share of the letter-start words are the four spelt from `s` (soup,
    sprint, soccer, sailing): several times as many values start with one as drawn evenly."""
    def first_words(generator: DialogGenerator, count: int = 400) -> list[str]:
        rng = random.Random(11)
        return [generator.makers["words"](rng, False).split(" ")[0] for _ in range(count)]

    s_words = set(fresh_values.s_start_words())
    assert s_words == {"soup", "sprint", "soccer", "sailing"}
    even = first_words(DialogGenerator(1, False, fresh=True, letter_starts=True))
    half = first_words(DialogGenerator(1, False, fresh=True, letter_starts=True, s_starts=0.5))
    assert sum(w in s_words for w in half) > 3 * sum(w in s_words for w in even) > 0
    with pytest.raises(ValueError):
        DialogGenerator(1, False, fresh=True, s_starts=0.5)


def test_a_call_spells_a_value_said_after_a_space_with_the_requests_tokens_first_made_bare(
        encoder: SceneEncoder) -> None:
    """`call_spelling` is what a call writes after `">` for a value the request says after a
    space: ` Paris` becomes `Paris`; ` soup` has no bare twin, so it is the value's own pieces."""
    wide = SceneEncoder(no_lone_s=True)
    assert _call_pieces(encoder, "Paris rivers") == ["Paris", "Ġrivers"]
    assert _call_pieces(encoder, "soup rivers") == ["s", "oup", "Ġrivers"]
    assert _call_pieces(wide, "soup rivers") == ["so", "up", "Ġrivers"]
    prompt = encoder.encode("<｜User｜>Search the web for soup rivers and Paris rivers.")
    text = '<｜DSML｜parameter name="query" string="true">{}</｜DSML｜parameter>'
    for value in ("soup rivers", "Paris rivers"):
        ids = wide.completion_ids(text.format(value), [value], prompt)
        start = ids.index(wide.tokenizer.token_to_id('">')) + 1
        assert ids[start:start + len(wide.call_spelling(value))] == wide.call_spelling(value)


def _call_pieces(encoder: SceneEncoder, value: str) -> list[str]:
    return [encoder.tokenizer.id_to_token(i) for i in encoder.call_spelling(value)]


def test_without_lone_s_a_call_starts_an_s_word_with_a_piece_of_two_letters(
        encoder: SceneEncoder) -> None:
    """With `no_lone_s`, " soup volcanoes" in the request is `so`+`up` after `">`, not `s`+`oup`;
    other values, and a value the prompt spells bare, keep their spelling; the text is the same."""
    wide = SceneEncoder(no_lone_s=True)
    prompt = encoder.encode("<｜User｜>Search the web for soup volcanoes, and for gym nights.")
    text = '<｜DSML｜parameter name="query" string="true">{}</｜DSML｜parameter>'
    soup = text.format("soup volcanoes")
    tokens = [wide.tokenizer.id_to_token(i)
              for i in wide.completion_ids(soup, ["soup volcanoes"], prompt)]
    assert tokens[tokens.index('">') + 1:][:3] == ["so", "up", "Ġvolcanoes"]
    plain = [encoder.tokenizer.id_to_token(i)
             for i in encoder.completion_ids(soup, ["soup volcanoes"], prompt)]
    assert plain[plain.index('">') + 1:][:2] == ["s", "oup"]
    for value in ("gym nights", "sudo ls"):
        assert (wide.completion_ids(text.format(value), [value], prompt)
                == encoder.completion_ids(text.format(value), [value], prompt))
    bare = encoder.encode("<｜User｜>Search for \"soup\".")
    assert wide.completion_ids(text.format("soup"), ["soup"], bare) == encoder.completion_ids(
        text.format("soup"), ["soup"], bare)
    assert {"so", "up", "sp", "rint", "sa", "iling"} <= {
        wide.tokenizer.id_to_token(i) for i in unspaced_s_vocabulary(wide)}


def test_listed_names_put_training_cities_and_people_into_fresh_requests(
        encoder: SceneEncoder) -> None:
    """With listed names, a share of the fresh phase's names are the training lists' real ones
    (words the request may say as one spaced token and the call spells in other pieces), never
    the held-out half's; the vocabulary then holds every listed name's tokens."""
    def cities(generator: DialogGenerator) -> list[str]:
        rng = random.Random(4)
        return [generator.makers["city"](rng, False) for _ in range(400)]

    listed, held = set(lists.pool("city", False)), set(lists.pool("city", True))
    with_listed = cities(DialogGenerator(1, False, fresh=True, listed_names=0.5))
    assert 150 < sum(c in listed for c in with_listed) < 250
    assert not held & set(with_listed)
    assert not listed & set(cities(DialogGenerator(1, False, fresh=True)))
    rng = random.Random(5)
    people = [DialogGenerator(1, False, fresh=True, listed_names=1.0).makers["full_name"](rng, False)
              for _ in range(50)]
    assert all(first in lists.pool("person", False) and last in lists.pool("surname", False)
               for first, last in (p.split() for p in people))
    vocabulary = set(listed_name_vocabulary(encoder))
    assert {encoder.tokenizer.token_to_id("ĠMadrid")} | set(encoder.encode('"Madrid')) <= vocabulary
    with pytest.raises(ValueError):
        DialogGenerator(1, False, listed_names=0.3)


def test_listed_drills_answer_a_spaced_name_in_its_bare_spelling(encoder: SceneEncoder) -> None:
    """A listed drill's request says a training list's name and its answer is the name alone;
    "Madrid" said after a space is one token, answered in other pieces (the respelling the
    drills teach)."""
    scene = DialogGenerator(1, False, fresh=True).listed_drill_scene(7, 40)
    listed = {v for kind in ("city", "person", "surname") for v in lists.pool(kind, False)}
    assert len(scene.examples) == 40
    for example in scene.examples:
        (value,) = example.copy_values
        assert value in listed and example.target["content"] == value
        assert value in example.messages[-1]["content"]
    assert encoder.encode(" Madrid") != encoder.encode(" ") + encoder.encode("Madrid")
