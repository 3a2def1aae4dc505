"""Which requests are constrained, and how: tools / tool_choice / response_format / thinking →
the structural tag (or JSON-schema constraint) the scheduler compiles, or a 400 naming the tool and
the schema keyword. Grammar acceptance with real XGrammar is in tests/scheduler/test_grammar.py."""
from __future__ import annotations

import json
from typing import Any, Optional

import pytest

from services.frontend.constraints import (BLOCK_CLOSE, BLOCK_OPEN, Constraint, ConstraintError,
                                           ConstraintKind, build_constraint)
from services.frontend.errors import RequestError

DSML = "｜DSML｜"


def tool(name: str, parameters: Optional[dict] = None, strict: Optional[bool] = None) -> dict:
    function: dict[str, Any] = {"name": name, "description": f"{name} tool"}
    if parameters is not None:
        function["parameters"] = parameters
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


WEATHER = tool("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["city"],
    "additionalProperties": False})
PING = tool("ping")


def tag_of(constraint: Optional[Constraint]) -> dict:
    assert constraint is not None and constraint.type is ConstraintKind.STRUCTURAL_TAG
    document = json.loads(constraint.spec)
    assert document["type"] == "structural_tag"
    return document["format"]


def invoked_names(spec: str) -> set[str]:
    return {part.split('\\"')[0] for part in spec.split(f'{DSML}invoke name=\\"')[1:]}


class TestWhenConstrained:
    def test_required_is_a_block_of_one_or_more_calls(self):
        fmt = tag_of(build_constraint({"tools": [WEATHER, PING], "tool_choice": "required"}, False))
        assert fmt["type"] == "sequence"
        first, calls, last = fmt["elements"]
        assert first == {"type": "const_string", "value": BLOCK_OPEN}
        assert last == {"type": "const_string", "value": BLOCK_CLOSE}
        assert calls["type"] == "plus" and len(calls["content"]["elements"]) == 2

    def test_named_tool_allows_only_that_tool(self):
        constraint = build_constraint({"tools": [WEATHER, PING], "tool_choice": {
            "type": "function", "function": {"name": "ping"}}}, False)
        assert invoked_names(constraint.spec) == {"ping"}

    def test_auto_with_a_strict_tool_is_constrained_with_a_triggered_block(self):
        strict_weather = tool("get_weather", WEATHER["function"]["parameters"], strict=True)
        fmt = tag_of(build_constraint({"tools": [strict_weather, PING], "tool_choice": "auto"},
                                      False))
        assert fmt["type"] == "triggered_tags" and fmt["stop_after_first"] is True
        assert fmt["triggers"] == ["\n\n<" + DSML]
        assert {"<think>", "</think>", DSML} <= set(fmt["excludes"])

    @pytest.mark.parametrize("body", [
        {"tools": [WEATHER, PING], "tool_choice": "auto"},
        {"tools": [WEATHER, tool("other", strict=False)]},
        {"tools": [WEATHER], "tool_choice": "none"},
        {"tools": [WEATHER], "tool_choice": "none", "parallel_tool_calls": False},
        {"messages": []},
        {"response_format": {"type": "text"}},
    ], ids=["auto-non-strict", "absent-non-strict", "none", "none-parallel-false", "no-tools",
            "text-format"])
    def test_unconstrained_requests(self, body):
        assert build_constraint(body, thinking=False) is None
        assert build_constraint(body, thinking=True) is None

    def test_parallel_false_allows_exactly_one_call(self):
        fmt = tag_of(build_constraint({"tools": [WEATHER, PING], "tool_choice": "required",
                                       "parallel_tool_calls": False}, False))
        calls = fmt["elements"][1]
        assert calls["type"] == "or" and "plus" not in json.dumps(calls)

    def test_thinking_mode_starts_with_a_reasoning_span_closed_by_think_end(self):
        fmt = tag_of(build_constraint({"tools": [WEATHER], "tool_choice": "required"}, True))
        reasoning, block = fmt["elements"]
        assert reasoning["type"] == "tag" and reasoning["begin"] == ""
        assert reasoning["end"] == "</think>" and reasoning["content"]["type"] == "any_text"
        assert block["elements"][0]["value"] == BLOCK_OPEN

    def test_chat_mode_has_no_reasoning_span(self):
        fmt = tag_of(build_constraint({"tools": [WEATHER], "tool_choice": "required"}, False))
        assert fmt["elements"][0] == {"type": "const_string", "value": BLOCK_OPEN}
        assert all(element.get("end") != "</think>" for element in fmt["elements"])


class TestParameterFlags:
    def test_flag_is_fixed_by_schema_type(self):
        spec = build_constraint({"tools": [WEATHER], "tool_choice": "required"}, False).spec
        assert 'parameter name=\\"city\\" string=\\"true\\">' in spec
        assert 'parameter name=\\"days\\" string=\\"false\\">' in spec
        assert 'parameter name=\\"tags\\" string=\\"false\\">' in spec
        assert 'string=\\"true|false' not in spec

    def test_string_enum_becomes_exactly_those_raw_strings(self):
        unit = tool("u", {"type": "object", "properties": {
            "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"]})
        spec = build_constraint({"tools": [unit], "tool_choice": "required"}, False).spec
        assert '{"type": "or", "elements": [{"type": "const_string", "value": "c"}, ' \
               '{"type": "const_string", "value": "f"}]}' in spec

    def test_json_parameter_carries_the_definitions_it_refers_to(self):
        ticket = tool("t", {"type": "object", "$defs": {"label": {"enum": ["bug", 1]}},
                            "properties": {"labels": {"type": "array",
                                                      "items": {"$ref": "#/$defs/label"}}}})
        fmt = tag_of(build_constraint({"tools": [ticket], "tool_choice": "required"}, False))
        json_values = [node for node in _walk(fmt) if node.get("type") == "json_schema"]
        assert json_values[0]["json_schema"]["$defs"] == {"label": {"enum": ["bug", 1]}}

    def test_zero_arg_tool_renders_a_blank_line(self):
        spec = build_constraint({"tools": [PING], "tool_choice": "required"}, False).spec
        assert json.dumps(f'<{DSML}invoke name="ping">\n', ensure_ascii=False) in spec
        assert '{"type": "const_string", "value": "\\n"}' in spec


class TestResponseFormat:
    SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}   # closed, so it is handed over verbatim

    def test_json_schema_in_chat_mode_is_a_json_schema_constraint(self):
        body = {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": self.SCHEMA}}}
        constraint = build_constraint(body, thinking=False)
        assert constraint.type is ConstraintKind.JSON_SCHEMA
        assert json.loads(constraint.spec) == self.SCHEMA

    def test_json_object_in_chat_mode(self):
        constraint = build_constraint({"response_format": {"type": "json_object"}}, False)
        assert constraint == Constraint(ConstraintKind.JSON_OBJECT, "")

    def test_thinking_mode_puts_the_json_after_the_reasoning_span(self):
        body = {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": self.SCHEMA}}}
        reasoning, value = tag_of(build_constraint(body, thinking=True))["elements"]
        assert reasoning["end"] == "</think>"
        assert value["type"] == "json_schema" and value["json_schema"] == self.SCHEMA

    def test_auto_tools_with_a_response_format_allow_json_or_a_call(self):
        body = {"tools": [WEATHER], "response_format": {"type": "json_object"}}
        fmt = tag_of(build_constraint(body, thinking=False))
        assert fmt["type"] == "or"
        assert [element["type"] for element in fmt["elements"]] == ["json_schema", "sequence"]

    def test_unsupported_keyword_in_response_schema(self):
        body = {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "array", "uniqueItems": True}}}}
        with pytest.raises(ConstraintError, match="uniqueItems") as caught:
            build_constraint(body, thinking=False)
        assert caught.value.param == "response_format.json_schema.schema.uniqueItems"


UNSUPPORTED = [
    ("if", {"type": "integer", "if": {"minimum": 5}, "then": {"multipleOf": 2}}),
    ("not", {"type": "integer", "not": {"const": 3}}),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
    ("patternProperties", {"type": "object", "patternProperties": {"^x": {"type": "integer"}}}),
    ("dependentRequired", {"type": "object", "properties": {"a": {"type": "integer"}},
                           "dependentRequired": {"a": ["b"]}}),
    ("format", {"type": "string", "format": "idn-email"}),
    ("format", {"type": "array", "items": {"type": "string", "format": "iri"}}),
    ("multipleOf", {"type": "number", "multipleOf": 0.5}),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}),
    ("allOf", {"allOf": [{"type": "integer"}, {"minimum": 3}]}),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "number"}]}),
    ("$ref", {"$ref": "https://example.com/schema.json"}),
    ("$ref", {"type": "array", "items": {"$ref": "#/$defs/n", "minimum": 5}}),
    ("pattern", {"type": "string", "pattern": "^a+$", "minLength": 2}),
    ("format", {"type": "string", "format": "date", "maxLength": 8}),
]


class TestUnsupportedSchemas:
    @pytest.mark.parametrize("keyword,schema", UNSUPPORTED,
                             ids=[f"{kw}-{i}" for i, (kw, _) in enumerate(UNSUPPORTED)])
    def test_error_names_tool_and_keyword(self, keyword, schema):
        bad = tool("lookup", {"type": "object", "properties": {"x": schema}})
        with pytest.raises(ConstraintError) as caught:
            build_constraint({"tools": [PING, bad], "tool_choice": "required"}, thinking=False)
        error = caught.value
        assert error.message.startswith(f"tool 'lookup': schema keyword '{keyword}'")
        assert error.param.startswith("tools[1].function.parameters.properties.x")
        assert isinstance(error, RequestError)

    @pytest.mark.parametrize("keyword", ["minProperties", "propertyNames", "anyOf", "$ref"])
    def test_top_level_keywords_the_dsml_block_cannot_express(self, keyword):
        parameters = {"type": "object", "properties": {"a": {"type": "string"}},
                      keyword: {"minProperties": 1, "propertyNames": {"pattern": "^a"},
                                "anyOf": [{"required": ["a"]}], "$ref": "#/$defs/x"}[keyword]}
        with pytest.raises(ConstraintError) as caught:
            build_constraint({"tools": [tool("f", parameters)], "tool_choice": "required"}, False)
        assert caught.value.message.startswith(f"tool 'f': schema keyword '{keyword}'")
        assert caught.value.param == f"tools[0].function.parameters.{keyword}"

    def test_disjoint_one_of_is_accepted(self):
        shape = {"oneOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
             "required": ["kind", "r"]},
            {"type": "object", "properties": {"kind": {"const": "square"}, "s": {"type": "number"}},
             "required": ["kind", "s"]}]}
        parameters = {"type": "object", "properties": {"shape": shape}}
        assert build_constraint({"tools": [tool("f", parameters)], "tool_choice": "required"},
                                False) is not None

    def test_schemas_are_not_checked_when_the_request_is_unconstrained(self):
        bad = tool("lookup", {"type": "object", "properties": {"x": {"not": {}}}})
        assert build_constraint({"tools": [bad], "tool_choice": "auto"}, thinking=False) is None

    def test_required_names_an_undeclared_parameter(self):
        bad = tool("f", {"type": "object", "properties": {}, "required": ["ghost"]})
        with pytest.raises(ConstraintError, match="ghost"):
            build_constraint({"tools": [bad], "tool_choice": "required"}, False)


class TestToolChoiceValidation:
    def test_named_tool_must_be_declared(self):
        with pytest.raises(ConstraintError, match="not declared") as caught:
            build_constraint({"tools": [WEATHER], "tool_choice": {
                "type": "function", "function": {"name": "launch_rockets"}}}, False)
        assert caught.value.param == "tool_choice.function.name"

    def test_required_without_tools(self):
        with pytest.raises(ConstraintError) as caught:
            build_constraint({"tool_choice": "required"}, False)
        assert caught.value.param == "tool_choice"

    @pytest.mark.parametrize("name", ["", "has space", 'quote"d', "x" * 65, "<tag>"])
    def test_tool_names_are_validated(self, name):
        with pytest.raises(ConstraintError) as caught:
            build_constraint({"tools": [tool(name)], "tool_choice": "required"}, False)
        assert caught.value.param == "tools[0].function.name"

    def test_duplicate_tool_names(self):
        with pytest.raises(ConstraintError, match="twice"):
            build_constraint({"tools": [PING, PING], "tool_choice": "required"}, False)

    def test_unknown_tool_choice_form(self):
        with pytest.raises(ConstraintError):
            build_constraint({"tools": [PING], "tool_choice": "sometimes"}, False)


def _walk(node: Any):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


@pytest.mark.parametrize("body,param", [
    ({"tools": [PING], "tool_choice": {"type": "function", "function": "ping"}}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": "x"}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"tools": {"name": "f"}}, "tools"),
    ({"tools": [{"type": "retrieval"}], "tool_choice": "required"}, "tools[0]"),
], ids=["function-not-object", "json-schema-not-object", "unknown-format", "tools-not-list",
        "non-function-tool"])
def test_malformed_fields_are_client_errors(body, param):
    with pytest.raises(ConstraintError) as caught:
        build_constraint(body, thinking=False)
    assert caught.value.param == param
