"""Extra keys below the top level, with real XGrammar and the real tokenizer: refused wherever the
schema says `additionalProperties: false` (nested objects, arrays of objects, `$defs` references),
allowed where it says `true` or a schema, or says nothing (JSON Schema's default; XGrammar's strict
mode would refuse them, see services/frontend/schema_openness.py).

Each case is one object-valued parameter; its value is fed as DSML `string="false"` JSON, as the
step loop would feed the model's tokens.
"""
from __future__ import annotations

from typing import Any

import pytest

from services.frontend.constraints import build_constraint
from tests.scheduler.test_grammar import block, feed, invoke, param

CLOSED = {"additionalProperties": False}
ROW = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def with_row_rule(rule: dict[str, Any]) -> dict[str, Any]:
    return {**ROW, **rule}


def nested_object(rule: dict[str, Any]) -> tuple[dict, str, str]:
    schema = {"type": "object", "properties": {"row": with_row_rule(rule)}, "required": ["row"],
              "additionalProperties": False}
    return schema, '{"row": {"a": 1}}', '{"row": {"a": 1, "zzz": 2}}'


def array_of_objects(rule: dict[str, Any]) -> tuple[dict, str, str]:
    schema = {"type": "array", "items": with_row_rule(rule)}
    return schema, '[{"a": 1}, {"a": 2}]', '[{"a": 1}, {"a": 2, "zzz": 3}]'


def defs_reference(rule: dict[str, Any]) -> tuple[dict, str, str]:
    return {"$ref": "#/$defs/row"}, '{"a": 1}', '{"a": 1, "zzz": 2}'


def reference_inside_array_inside_object(rule: dict[str, Any]) -> tuple[dict, str, str]:
    schema = {"type": "object", "properties": {"rows": {"type": "array",
                                                        "items": {"$ref": "#/$defs/row"}}},
              "additionalProperties": False}
    return schema, '{"rows": [{"a": 1}]}', '{"rows": [{"a": 1, "zzz": 2}]}'


SHAPES = [nested_object, array_of_objects, defs_reference, reference_inside_array_inside_object]


def constraint_for(shape, rule: dict[str, Any]):
    schema, valid, extra = shape(rule)
    parameters = {"type": "object", "$defs": {"row": with_row_rule(rule)},
                  "properties": {"value": schema}, "required": ["value"]}
    body = {"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
            "tool_choice": "required"}
    return build_constraint(body, thinking=False), valid, extra


def call(value: str) -> str:
    return block(invoke("f", param("value", value, False)))


@pytest.mark.parametrize("shape", SHAPES, ids=[shape.__name__ for shape in SHAPES])
def test_extra_keys_are_refused_where_additional_properties_is_false(shape, service, tokenizer):
    constraint, valid, extra = constraint_for(shape, CLOSED)
    assert feed(service, tokenizer, constraint, call(valid)) == (True, True)
    assert feed(service, tokenizer, constraint, call(extra))[0] is False


@pytest.mark.parametrize("rule", [{}, {"additionalProperties": True}], ids=["absent", "true"])
@pytest.mark.parametrize("shape", SHAPES, ids=[shape.__name__ for shape in SHAPES])
def test_extra_keys_are_allowed_where_additional_properties_is_absent_or_true(
        shape, rule, service, tokenizer):
    constraint, valid, extra = constraint_for(shape, rule)
    assert feed(service, tokenizer, constraint, call(valid)) == (True, True)
    assert feed(service, tokenizer, constraint, call(extra)) == (True, True)


def test_extra_keys_follow_an_additional_properties_schema(service, tokenizer):
    constraint, _, _ = constraint_for(nested_object, {"additionalProperties": {"type": "integer"}})
    assert feed(service, tokenizer, constraint, call('{"row": {"a": 1, "n": 2}}')) == (True, True)
    assert feed(service, tokenizer, constraint, call('{"row": {"a": 1, "n": "x"}}'))[0] is False


def test_items_after_prefix_items_follow_the_schema(service, tokenizer):
    for items, extra_allowed in ((False, False), (None, True), (True, True)):
        schema = {"type": "array", "prefixItems": [{"type": "integer"}]}
        if items is not None:
            schema["items"] = items
        body = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"value": schema}, "required": ["value"]}}}],
            "tool_choice": "required"}
        constraint = build_constraint(body, thinking=False)
        assert feed(service, tokenizer, constraint, call("[1]")) == (True, True)
        assert feed(service, tokenizer, constraint, call('[1, "x"]'))[0] is extra_allowed, items


@pytest.mark.parametrize("thinking", [False, True])
def test_response_format_refuses_nested_extra_keys_only_where_closed(thinking, service, tokenizer):
    schema = {"type": "object", "properties": {"closed": with_row_rule(CLOSED),
                                               "open": with_row_rule({})}}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                       "schema": schema}}}
    constraint = build_constraint(body, thinking=thinking)
    prefix = "Sure.</think>" if thinking else ""
    accepted = prefix + '{"closed": {"a": 1}, "open": {"a": 2, "zzz": 3}, "top": 4}'
    refused = prefix + '{"closed": {"a": 1, "zzz": 2}}'
    assert feed(service, tokenizer, constraint, accepted) == (True, True)
    assert feed(service, tokenizer, constraint, refused)[0] is False
