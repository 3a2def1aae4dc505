"""The JSON schemas the frontend hands XGrammar are the declared ones, except where it rewrites them
on purpose. The deliberate rewrites (services/frontend/constraints.py, schema_openness.py):

1. A tool's `parameters` object is not a JSON value: each parameter is its own DSML element, so its
   top level (`properties`, `required`, `additionalProperties`) becomes the argument list.
2. A string-typed parameter is raw text (`string="true"`), a structural-tag text/regex format rather
   than a JSON schema.
3. A `type` list holding "string" and others splits: a raw-text branch and a JSON branch holding the
   (`$ref`-resolved) schema with the other types.
4. A JSON parameter carries the parameters' root `$defs` / `definitions` (its own keys win), so its
   `$ref`s resolve inside the document XGrammar compiles alone.
5. A parameter schema `true` becomes `{}` (the same set of values).
6. JSON Schema's implicit openness is written out (`additionalProperties: true` on objects with
   `properties`, `items: true` after `prefixItems`), because XGrammar compiles in strict mode.

Everything else, boolean sub-schemas such as a nested `additionalProperties: false` included, must
reach XGrammar unchanged. Grammar acceptance of the same shapes is tests/scheduler/test_grammar_nested.py.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Optional

import pytest

from services.frontend.constraints import ConstraintKind, build_constraint
from services.frontend.schema_openness import with_explicit_openness
from tests.frontend.test_constraints import _walk as walk

DSML = "｜DSML｜"
JSON_PARAM_BEGIN = re.compile(f'^<{DSML}parameter name="(.+)" string="false">$')
CORPUS = json.loads((Path(__file__).resolve().parents[1] / "data" / "tool_schemas.json")
                    .read_text(encoding="utf-8"))["tools"]

POINT = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
         "required": ["x", "y"], "additionalProperties": False}
NESTED = {"type": "object", "$defs": {"point": POINT}, "properties": {
    "config": {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {"a": {"type": "integer"}},
                  "additionalProperties": False},
        "open": {"type": "object", "properties": {"b": {"type": "integer"}}}},
        "additionalProperties": False},
    "rows": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}},
                                        "additionalProperties": False}},
    "origin": {"$ref": "#/$defs/point"},
    "path": {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 3},
    "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}],
             "items": False},
    "anything": True,
    "label": {"type": ["string", "integer"], "minimum": 0},
    "name": {"type": "string"}}}


def tool(name: str, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def handed_json_schemas(parameters: Any) -> dict[str, dict]:
    """Parameter name → the JSON schema XGrammar gets for its `string="false"` value (the argument
    list repeats a parameter in each branch that can start with it: every copy must agree)."""
    constraint = build_constraint({"tools": [tool("t", parameters)], "tool_choice": "required"},
                                  thinking=False)
    found: dict[str, dict] = {}
    for node in walk(json.loads(constraint.spec)):
        elements = node.get("elements") if node.get("type") == "sequence" else None
        if not elements or len(elements) < 2 or elements[1].get("type") != "json_schema":
            continue
        begin = JSON_PARAM_BEGIN.match(elements[0].get("value", ""))
        if begin:
            schema = found.setdefault(begin.group(1), elements[1]["json_schema"])
            assert schema == elements[1]["json_schema"], begin.group(1)
    return found


def expected_json_schema(parameters: dict, name: str) -> Optional[dict]:
    """Rules 2-6 of the module docstring for one declared parameter (None: raw text only)."""
    declared = parameters["properties"][name]
    declared = {} if declared is True else declared
    resolved = resolve(parameters, declared)
    types = resolved.get("type")
    if types == "string" or (types is None and is_string_enum(resolved)):
        return None
    if isinstance(types, list) and "string" in types and len(types) > 1 \
            and "enum" not in resolved and "const" not in resolved:
        declared = dict(resolved, type=[t for t in types if t != "string"])
    document = dict(declared)
    for keyword in ("$defs", "definitions"):
        if keyword in parameters:
            document.setdefault(keyword, parameters[keyword])
    return with_explicit_openness(document)


def resolve(parameters: dict, schema: dict) -> dict:
    while "$ref" in schema:
        _, group, name = schema["$ref"].split("/")
        schema = parameters[group][name]
    return schema


def is_string_enum(schema: dict) -> bool:
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    return isinstance(values, list) and bool(values) and all(isinstance(v, str) for v in values)


@pytest.mark.parametrize("parameters", [NESTED] + [
    t["function"]["parameters"] for t in CORPUS if t["function"].get("parameters")],
    ids=["nested"] + [t["function"]["name"] for t in CORPUS if t["function"].get("parameters")])
def test_json_parameters_reach_xgrammar_as_declared_but_for_the_documented_rewrites(
        parameters: dict) -> None:
    pristine = copy.deepcopy(parameters)
    handed = handed_json_schemas(parameters)
    expected = {name: expected_json_schema(parameters, name) for name in parameters["properties"]}
    assert handed == {name: schema for name, schema in expected.items() if schema is not None}
    assert parameters == pristine            # the request body is never modified


def test_nested_closed_objects_and_false_sub_schemas_are_handed_over_verbatim() -> None:
    handed = handed_json_schemas(NESTED)
    config = handed["config"]
    assert config["additionalProperties"] is False
    assert config["properties"]["inner"]["additionalProperties"] is False
    assert config["properties"]["open"]["additionalProperties"] is True     # rule 6
    assert handed["rows"]["items"]["additionalProperties"] is False
    assert handed["pair"]["items"] is False
    for name in ("origin", "path"):
        assert handed[name]["$defs"]["point"] == POINT
    assert handed["anything"] == {"$defs": {"point": POINT}}
    assert handed["label"]["type"] == ["integer"] and "name" not in handed


@pytest.mark.parametrize("thinking", [False, True])
def test_response_format_schema_reaches_xgrammar_as_declared_with_openness_written_out(
        thinking: bool) -> None:
    schema = {"type": "object", "$defs": {"point": POINT}, "properties": {
        "where": {"$ref": "#/$defs/point"},
        "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}}},
        "required": ["where"], "additionalProperties": False}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                       "schema": schema}}}
    constraint = build_constraint(body, thinking=thinking)
    if thinking:
        handed = [node["json_schema"] for node in walk(json.loads(constraint.spec))
                  if node.get("type") == "json_schema"]
        assert len(handed) == 1
        handed = handed[0]
    else:
        assert constraint.type is ConstraintKind.JSON_SCHEMA
        handed = json.loads(constraint.spec)
    opened = copy.deepcopy(schema)
    opened["properties"]["tags"]["items"]["additionalProperties"] = True
    assert handed == opened


class TestExplicitOpenness:
    def test_objects_with_properties_get_additional_properties_true_at_every_depth(self):
        schema = {"properties": {"a": {"type": "object", "properties": {}}},
                  "$defs": {"d": {"properties": {"x": {}}}},
                  "anyOf": [{"properties": {"y": {}}}],
                  "items": {"prefixItems": [{"properties": {}}]}}
        opened = with_explicit_openness(schema)
        assert opened["additionalProperties"] is True
        assert opened["properties"]["a"]["additionalProperties"] is True
        assert opened["$defs"]["d"]["additionalProperties"] is True
        assert opened["anyOf"][0]["additionalProperties"] is True
        assert opened["items"]["prefixItems"][0]["additionalProperties"] is True
        assert opened["items"]["items"] is True
        assert "additionalProperties" not in schema        # the input is not modified

    @pytest.mark.parametrize("closing", [{"additionalProperties": False},
                                         {"additionalProperties": {"type": "integer"}},
                                         {"unevaluatedProperties": False}])
    def test_a_stated_closing_is_kept(self, closing):
        schema = {"type": "object", "properties": {"a": {}}, **closing}
        assert with_explicit_openness(schema) == schema

    def test_objects_without_properties_and_stated_items_are_left_alone(self):
        for schema in ({"type": "object"}, {"type": "object", "additionalProperties": True},
                       {"prefixItems": [{}], "items": False}, {"type": "array", "items": {}},
                       True, False):
            assert with_explicit_openness(schema) == schema

    def test_data_values_are_never_treated_as_schemas(self):
        data = {"properties": {"k": 1}}
        schema = {"enum": [data], "const": data, "default": data, "examples": [data]}
        assert with_explicit_openness(schema) == schema
