"""Composed request templates: many phrasings per tool, arguments still exactly the placeholders,
and no held-out sentence brought into training."""
from __future__ import annotations

import random

import pytest

from services.demo.composed import PARTS, WIDE_PARTS, Composer, HeldOutGuard, ngrams, placeholders
from services.demo.composed_wide import WIDE_PHRASES
from services.demo.dialogs import FRAMED_SHARE, DialogGenerator
from services.demo.tools import CATALOG


@pytest.mark.parametrize("table", [PARTS, WIDE_PARTS], ids=["parts", "wide"])
def test_every_tool_has_parts_and_every_required_parameter_a_place(table) -> None:
    assert set(table) == {spec.name for spec in CATALOG}
    for spec in CATALOG:
        parts = table[spec.name]
        for head in parts.heads:
            assert placeholders(head) <= {p.name for p in spec.params}, (spec.name, head)
            for name in spec.required:
                assert "{" + name + "}" in head or name in parts.slots, (spec.name, head, name)
        for name, phrases in parts.slots.items():
            assert all("{" + name + "}" in phrase for phrase in phrases), (spec.name, name)


@pytest.mark.parametrize("wide", [False, True])
def test_composed_templates_set_the_required_and_only_declared_parameters(wide: bool) -> None:
    composer, rng = Composer(wide=wide), random.Random(3)
    for spec in CATALOG:
        for _ in range(60):
            declared = {p.name for p in spec.params
                        if p.name in spec.required or rng.random() < 0.6}
            template = composer.template(spec, rng, declared, FRAMED_SHARE)
            assert template is not None
            assert set(spec.required) <= placeholders(template) <= declared, template


def test_each_tool_is_asked_in_many_different_sentences() -> None:
    composer, rng = Composer(), random.Random(5)
    for spec in CATALOG:
        every = {p.name for p in spec.params}
        templates = {composer.template(spec, rng, every, FRAMED_SHARE) for _ in range(200)}
        assert len(templates) >= 60, spec.name        # the catalog has 3–9 per tool


@pytest.mark.parametrize("wide", [False, True])
def test_no_composed_template_holds_a_held_out_sentence_part_training_lacked(wide: bool) -> None:
    guard, composer, rng = HeldOutGuard(), Composer(wide=wide), random.Random(11)
    train = set().union(*(ngrams(t) for spec in CATALOG for t in spec.train))
    for spec in CATALOG:
        for template in spec.held_out:
            assert not guard.allows(template) or ngrams(template) <= train, template
        every = {p.name for p in spec.params}
        for _ in range(300):
            template = composer.template(spec, rng, every, FRAMED_SHARE)
            assert template not in spec.held_out
            for held in spec.held_out:
                assert not (ngrams(template) & ngrams(held)) - train, (template, held)


def test_a_generator_with_composed_templates_copies_every_free_value_from_the_request() -> None:
    generator = DialogGenerator(1, False, fresh=True, frames=True, composed_share=1.0)
    calls = [e for i in range(4) for e in generator.scene(i, 24).examples if e.kind == "call"]
    assert len(calls) > 20
    for example in calls:
        for value in example.novel_values:
            assert value in example.messages[-1]["content"], (value, example.messages)
    with pytest.raises(ValueError):
        DialogGenerator(1, True, composed_share=0.5)


def test_no_wider_value_phrase_is_or_holds_a_held_out_phrase_or_another_values_phrase() -> None:
    for spec in CATALOG:
        for name, by_value in WIDE_PHRASES.get(spec.name, {}).items():
            param = next(p for p in spec.params if p.name == name)
            assert set(by_value) == set(param.phrases), (spec.name, name)
            held = [h.lower() for v in param.phrases for h in param.phrase_options(v, True)]
            for value, phrases in by_value.items():
                others = [t.lower() for v in param.phrases if v != value
                          for t in param.phrase_options(v, False) + list(by_value[v])]
                for phrase in phrases:
                    assert not any(h in phrase.lower() for h in held), (spec.name, phrase)
                    assert not any(o in phrase.lower().split() or o == phrase.lower()
                                   for o in others), (spec.name, phrase)


def test_wider_parts_say_enum_values_in_phrases_the_catalog_never_uses() -> None:
    generator = DialogGenerator(1, False, fresh=True, composed_share=1.0,
                                composer=Composer(wide=True))
    wide = {p for tool in WIDE_PHRASES.values() for by_value in tool.values()
            for phrases in by_value.values() for p in phrases}
    requests = [e.messages[-1]["content"] for i in range(6)
                for e in generator.scene(i, 24).examples if e.kind == "call"]
    assert sum(any(p in r for p in wide) for r in requests) >= 5


def _says_an_optional_parameter_in_its_head(spec, template: str) -> bool:
    return any(head in template for head in WIDE_PARTS[spec.name].heads
               if placeholders(head) - set(spec.required))


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_a_leading_share_starts_templates_with_heads_saying_an_optional_parameter(
        share: float) -> None:
    composer, rng = Composer(wide=True, leading_share=share), random.Random(13)
    by_tool = {spec.name: spec for spec in CATALOG}
    event, email = by_tool["create_event"], by_tool["send_email"]
    every = {p.name for p in event.params}
    templates = [composer.template(event, rng, every, 0.0) for _ in range(100)]
    leading = [_says_an_optional_parameter_in_its_head(event, t) for t in templates]
    assert all(leading) if share else sum(leading) < 50
    # a tool without such heads composes as before
    assert composer.template(email, rng, {p.name for p in email.params}, 0.0) is not None
