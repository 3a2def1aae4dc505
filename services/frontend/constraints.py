"""OpenAI `tools` / `tool_choice` / `response_format` + thinking mode → a grammar constraint.

The constraint is an XGrammar 0.2.7 structural tag (JSON text) for the DeepSeek-V4 DSML tool-call
format (`structural_tag.py` spells the block, `parameter_formats.py` each parameter), or a plain JSON
schema for `response_format` alone.

Decisions (the API contract leaves them open):
- `tool_choice: "none"` → unconstrained (no tool-call grammar; the prompt decides what tools show).
- `response_format` json_* together with `tool_choice: "auto"` tools → the output is either one JSON
  value or one tool-call block. With `required` / a named tool the call wins (the output is a call).
- Compile cost: XGrammar 0.2.7 compiles bounded repetitions (maxLength, `{m,n}` in patterns) slowly
  (~1-1.5 s each on 2 cores); grammars are cached by text in the scheduler, which also lifts a raw
  string's maxLength out of the grammar and enforces it itself (scheduler/raw_string_lift.py). The work one request
  may cause is bounded by `SchemaBounds` (depth, sub-schemas, properties, enum values, length
  keywords, the size of the structural tag itself).
- Schema keywords XGrammar 0.2.7 ignores and that would change validity (if/then/else, not,
  dependentRequired, uniqueItems, contains, $ref siblings, multi-branch allOf, overlapping oneOf,
  non-integer multipleOf, unknown formats, ...) are rejected with a `ConstraintError` naming the
  tool and the keyword.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from services.common.config import SchemaBounds
from services.common.constraint_kind import ConstraintKind
from services.frontend import structural_tag as st
from services.frontend.errors import ConstraintError
from services.frontend.parameter_formats import ParameterFormats
from services.frontend.schema_checker import SchemaBudget, SchemaChecker
from services.frontend.schema_openness import with_explicit_openness
from services.frontend.structural_tag import BLOCK_CLOSE, BLOCK_OPEN

__all__ = ["BLOCK_CLOSE", "BLOCK_OPEN", "Constraint", "ConstraintError", "ConstraintKind",
           "build_constraint"]

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(frozen=True)
class Constraint:
    type: ConstraintKind
    spec: str   # structural tag JSON / JSON schema text / "" for JSON_OBJECT


def build_constraint(body: dict[str, Any], thinking: bool,
                     bounds: SchemaBounds = SchemaBounds()) -> Optional[Constraint]:
    """The constraint for a chat request, or None when it is unconstrained.

    `thinking`: the prompt ends with `<think>`, so the output starts with a reasoning span closed by
    `</think>` (chat mode: the prompt already closed it).
    """
    budget = SchemaBudget(bounds)
    tools = _declared_tools(body, budget)
    choice = _tool_choice(body, tools)
    json_format = _response_format(body, budget)
    parallel = body.get("parallel_tool_calls", True) is not False
    if choice == "none" or not tools:
        if json_format is None:
            return None
        if not thinking:
            return _plain_json_constraint(body)
        return _structural_tag(st.with_reasoning(json_format, thinking), bounds)
    if choice == "auto":
        if json_format is not None:
            block = st.block(_invokes(tools.values()), parallel)
            return _structural_tag(st.with_reasoning(st.one_of([json_format, block]), thinking),
                                   bounds)
        if not any(tool.strict for tool in tools.values()):
            return None
        auto_block = st.auto_block(_invokes(tools.values()), parallel)
        return _structural_tag(st.with_reasoning(auto_block, thinking), bounds)
    selected = tools.values() if choice == "required" else [tools[choice]]
    return _structural_tag(st.with_reasoning(st.block(_invokes(selected), parallel), thinking),
                           bounds)


@dataclass(frozen=True)
class _Tool:
    name: str
    strict: bool
    parameters: Any
    path: str   # JSON path of the tool's parameters, for errors
    budget: SchemaBudget

    def invoke(self) -> st.Format:
        """The invoke's structural-tag format (checks the schema: may raise ConstraintError)."""
        checker = SchemaChecker(self.name, self.path, self.budget)
        return st.invoke(self.name, ParameterFormats(checker).parameters(self.parameters))


def _invokes(tools: Any) -> list[st.Format]:
    return [tool.invoke() for tool in tools]


def _declared_tools(body: dict[str, Any], budget: SchemaBudget) -> dict[str, _Tool]:
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise ConstraintError("tools must be a list", "tools")
    tools: dict[str, _Tool] = {}
    for index, raw in enumerate(raw_tools):
        path = f"tools[{index}]"
        if not isinstance(raw, dict) or raw.get("type", "function") != "function" \
                or not isinstance(raw.get("function"), dict):
            raise ConstraintError("each tool must be {\"type\": \"function\", \"function\": {...}}",
                                  path)
        function = raw["function"]
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise ConstraintError("tool names must be 1-64 characters of a-z, A-Z, 0-9, '_', '.', "
                                  "'-'", f"{path}.function.name")
        if name in tools:
            raise ConstraintError(f"tool '{name}' is declared twice", f"{path}.function.name")
        tools[name] = _Tool(name, function.get("strict") is True, function.get("parameters"),
                            f"{path}.function.parameters", budget)
    return tools


def _tool_choice(body: dict[str, Any], tools: dict[str, _Tool]) -> str:
    """"none" / "auto" / "required" / the name of the forced tool."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise ConstraintError("tool_choice 'required' needs at least one tool", "tool_choice")
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" \
            or not isinstance(name, str):
        raise ConstraintError("tool_choice must be 'none', 'auto', 'required' or {\"type\": "
                              "\"function\", \"function\": {\"name\": ...}}", "tool_choice")
    if name not in tools:
        raise ConstraintError(f"tool_choice names tool '{name[:64]}', which is not declared in "
                              "tools", "tool_choice.function.name")
    return name


def _response_format(body: dict[str, Any], budget: SchemaBudget) -> Optional[st.Format]:
    """The JSON-value format asked for by `response_format`, or None for text / absent."""
    response_format = body.get("response_format")
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return st.json_value({"type": "object"})
    if kind == "json_schema":
        json_schema = response_format.get("json_schema")
        schema = json_schema.get("schema") if isinstance(json_schema, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise ConstraintError("response_format.json_schema.schema must be a JSON schema",
                                  "response_format.json_schema.schema")
        if isinstance(schema, dict):
            SchemaChecker("response_format", "response_format.json_schema.schema", budget,
                          allow_root_ref=True).check_document(schema)
        return st.json_value(schema)
    raise ConstraintError("response_format.type must be 'text', 'json_object' or 'json_schema'",
                          "response_format.type")


def _plain_json_constraint(body: dict[str, Any]) -> Constraint:
    response_format = body["response_format"]
    if response_format["type"] == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT, "")
    schema = response_format["json_schema"]["schema"]
    return Constraint(ConstraintKind.JSON_SCHEMA,
                      json.dumps(with_explicit_openness(schema), ensure_ascii=False))


def _structural_tag(fmt: st.Format, bounds: SchemaBounds) -> Constraint:
    size = st.encoded_size(fmt)
    if size > bounds.max_grammar_bytes:
        raise ConstraintError(f"the tools and schemas of this request make a grammar of {size} "
                              f"bytes, over the server's limit of {bounds.max_grammar_bytes}",
                              "tools")
    return Constraint(ConstraintKind.STRUCTURAL_TAG, st.structural_tag_json(fmt))
