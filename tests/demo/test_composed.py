"""Composed request templates: many phrasings per tool, arguments still exactly the placeholders,
and no held-out sentence brought into training."""
from __future__ import annotations

import random
import string

import pytest

from services.demo.composed import PARTS, Composer, HeldOutGuard, ngrams
from services.demo.dialogs import FRAMED_SHARE, DialogGenerator
from services.demo.tools import CATALOG


def _placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_every_tool_has_parts_and_every_required_parameter_a_place() -> None:
    assert set(PARTS) == {spec.name for spec in CATALOG}
    for spec in CATALOG:
        parts = PARTS[spec.name]
        for head in parts.heads:
            for name in spec.required:
                assert "{" + name + "}" in head or name in parts.slots, (spec.name, head, name)
        for name, phrases in parts.slots.items():
            assert all("{" + name + "}" in phrase for phrase in phrases), (spec.name, name)


def test_composed_templates_set_the_required_and_only_declared_parameters() -> None:
    composer, rng = Composer(), random.Random(3)
    for spec in CATALOG:
        for _ in range(60):
            declared = {p.name for p in spec.params
                        if p.name in spec.required or rng.random() < 0.6}
            template = composer.template(spec, rng, declared, FRAMED_SHARE)
            assert template is not None
            assert set(spec.required) <= _placeholders(template) <= declared, template


def test_each_tool_is_asked_in_many_different_sentences() -> None:
    composer, rng = Composer(), random.Random(5)
    for spec in CATALOG:
        every = {p.name for p in spec.params}
        templates = {composer.template(spec, rng, every, FRAMED_SHARE) for _ in range(200)}
        assert len(templates) >= 60, spec.name        # the catalog has 3–9 per tool


def test_no_composed_template_holds_a_held_out_sentence_part_training_lacked() -> None:
    guard, composer, rng = HeldOutGuard(), Composer(), random.Random(11)
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
