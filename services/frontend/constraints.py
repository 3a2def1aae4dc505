"""OpenAI `tools` / `tool_choice` / `response_format` + thinking mode → a grammar constraint.

The constraint is an XGrammar 0.2.7 structural tag (JSON text) for the DeepSeek-V4 DSML tool-call
format, byte-exact with the chat format:

    "\\n\\n<｜DSML｜tool_calls>\\n"
    <｜DSML｜invoke name="NAME">\\n
    <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\\n   (one per argument)
    </｜DSML｜invoke>\\n                                                 (more invokes if parallel)
    </｜DSML｜tool_calls>                                                then EOS

Unlike XGrammar's built-in `deepseek_v4` template, the `string` flag of every parameter is fixed
by its schema type: a string-typed parameter is `string="true"` + raw text (never containing the
closing tag), anything else is `string="false"` + JSON for that sub-schema. A call with no
arguments renders as `<｜DSML｜invoke name="f">\\n\\n</｜DSML｜invoke>` (a blank line), as in the
chat format.

Decisions (the API contract leaves them open):
- `tool_choice: "none"` → unconstrained (no tool-call grammar; the prompt decides what tools show).
- Only declared parameters are ever generated. When `additionalProperties` is not `false`, unknown
  parameters would be allowed by the schema but cannot be typed, so the grammar offers none (the
  output stays valid; it merely never uses that freedom).
- `response_format` json_* together with `tool_choice: "auto"` tools → the output is either one JSON
  value or one tool-call block. With `required` / a named tool the call wins (the output is a call).
- Raw string parameters: `minLength` is met by `minLength` leading characters that are not `<`
  (so the closing tag cannot start inside them); `pattern` is matched in full (XGrammar anchors it);
  `format` supports date, time, date-time, email, uuid, ipv4, hostname and http(s) uri through
  conservative regexes (every match is valid, not every valid value matches).
- Known limit: a JSON value (`string="false"`) may itself contain the text `</｜DSML｜parameter>`
  inside a JSON string; a parser that cuts at the first closing tag (rather than parsing the JSON
  value) would then split it wrongly. Raw string values can never contain it.
- Compile cost: XGrammar 0.2.7 compiles bounded repetitions (maxLength, `{m,n}` in patterns) slowly
  (~1-1.5 s each on 2 cores); grammars are cached by text in the scheduler.
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

from services.common.constraint_kind import ConstraintKind
from services.frontend.errors import RequestError
from services.frontend.schema_openness import with_explicit_openness

DSML = "｜DSML｜"
BLOCK_OPEN = f"\n\n<{DSML}tool_calls>\n"
# The auto-mode trigger stops at the DSML token: XGrammar 0.2.7 lets free text continue after a
# partial match of a longer trigger without applying the excludes (measured: "\n\n<｜DSML｜<" was
# accepted as text), while with this trigger `｜DSML｜` after "\n\n<" can only open the block.
BLOCK_TRIGGER = f"\n\n<{DSML}"
BLOCK_CLOSE = f"</{DSML}tool_calls>"
INVOKE_CLOSE = f"</{DSML}invoke>\n"
PARAM_CLOSE = f"</{DSML}parameter>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Free text (reasoning, or content before an auto call) never contains think tags or DSML markup,
# so the parser can never mistake it for a block.
FREE_TEXT_EXCLUDES = [THINK_OPEN, THINK_CLOSE, DSML]
# DSML markup and think tags never belong inside a raw string argument either. Excluding them also
# means a `｜DSML｜` after `</` can only start the closing tag, so the grammar forces the rest of it.
# (`</｜DSML｜` is listed on its own: XGrammar 0.2.7 lets `｜DSML｜` through right after `</`
# inside a tag whose end starts that way, measured.)
RAW_STRING_EXCLUDES = [*FREE_TEXT_EXCLUDES, f"</{DSML}"]
JSON_MAX_WHITESPACE = 1

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
PARAM_NAME_FORBIDDEN = re.compile(r"[\"<>\n\r]")

ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$schema", "$id",
    "$anchor", "strict", "nullable", "discriminator",
})
RAW_STRING_KEYWORDS = frozenset({"type", "enum", "const", "pattern", "format", "minLength",
                                 "maxLength"}) | ANNOTATIONS
# Keywords XGrammar 0.2.7's JSON-schema converter ignores (verified by probing) though they restrict
# which values are valid.
IGNORED_BY_XGRAMMAR = frozenset({
    "if", "then", "else", "not", "dependentRequired", "dependentSchemas", "dependencies",
    "$dynamicRef", "$recursiveRef", "contains", "minContains", "maxContains", "patternProperties",
})
# Formats XGrammar 0.2.7 enforces inside JSON values (others are silently ignored).
XGRAMMAR_FORMATS = frozenset({
    "email", "date-time", "date", "time", "duration", "uuid", "uri", "ipv4", "ipv6", "hostname",
    "json-pointer", "relative-json-pointer",
})
_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
_HOUR_MINUTE = r"([01][0-9]|2[0-3]):[0-5][0-9]"
_TIME = rf"{_HOUR_MINUTE}:[0-5][0-9](\.[0-9]{{1,6}})?(Z|[+\-]{_HOUR_MINUTE})"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9\-]{0,61}[A-Za-z0-9])?"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# Bounded repetitions are expensive to compile in XGrammar 0.2.7 (~1 s each, measured), so the
# regexes are unbounded where the format has no length limit (email, uri).
RAW_FORMAT_REGEX = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "email": r"[A-Za-z0-9._+\-]+@[A-Za-z0-9]+(\.[A-Za-z0-9]+)+",
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "ipv4": rf"({_OCTET}\.){{3}}{_OCTET}",
    "hostname": rf"{_LABEL}(\.{_LABEL})*",
    "uri": r"https?://[A-Za-z0-9]+(\.[A-Za-z0-9\-]+)*(/[A-Za-z0-9._~\-]*)*",
}


@dataclass(frozen=True)
class Constraint:
    type: ConstraintKind
    spec: str   # structural tag JSON / JSON schema text / "" for JSON_OBJECT


class ConstraintError(RequestError):
    """The request asks for a constraint the grammar cannot express → HTTP 400."""

    def __init__(self, message: str, param: Optional[str] = None) -> None:
        super().__init__(message, param, "invalid_request_error")


def build_constraint(body: dict[str, Any], thinking: bool) -> Optional[Constraint]:
    """The constraint for a chat request, or None when it is unconstrained.

    `thinking`: the prompt ends with `<think>`, so the output starts with a reasoning span closed by
    `</think>` (chat mode: the prompt already closed it).
    """
    tools = _declared_tools(body)
    choice = _tool_choice(body, tools)
    json_format = _response_format(body)
    parallel = body.get("parallel_tool_calls", True) is not False
    if choice == "none" or not tools:
        if json_format is None:
            return None
        if not thinking:
            return _plain_json_constraint(body)
        return _structural_tag(_with_reasoning(json_format, thinking))
    if choice == "auto":
        if json_format is not None:
            block = _block(list(tools.values()), parallel)
            return _structural_tag(_with_reasoning({"type": "or", "elements": [json_format, block]},
                                                   thinking))
        if not any(tool.strict for tool in tools.values()):
            return None
        auto_block = _auto_block(list(tools.values()), parallel)
        return _structural_tag(_with_reasoning(auto_block, thinking))
    selected = list(tools.values()) if choice == "required" else [tools[choice]]
    return _structural_tag(_with_reasoning(_block(selected, parallel), thinking))


# ---- request fields ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tool:
    name: str
    strict: bool
    parameters: Any
    path: str   # JSON path of the tool's parameters, for errors

    def invoke(self) -> dict[str, Any]:
        """The invoke's structural-tag format (checks the schema: may raise ConstraintError)."""
        return _invoke(self.name, self.parameters, _SchemaChecker(self.name, self.path))


def _declared_tools(body: dict[str, Any]) -> dict[str, _Tool]:
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
                            f"{path}.function.parameters")
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


def _response_format(body: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The JSON-value format asked for by `response_format`, or None for text / absent."""
    response_format = body.get("response_format")
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return _json_value({"type": "object"})
    if kind == "json_schema":
        json_schema = response_format.get("json_schema")
        schema = json_schema.get("schema") if isinstance(json_schema, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise ConstraintError("response_format.json_schema.schema must be a JSON schema",
                                  "response_format.json_schema.schema")
        if isinstance(schema, dict):
            _SchemaChecker("response_format", "response_format.json_schema.schema",
                           allow_root_ref=True).check_document(schema)
        return _json_value(schema)
    raise ConstraintError("response_format.type must be 'text', 'json_object' or 'json_schema'",
                          "response_format.type")


def _plain_json_constraint(body: dict[str, Any]) -> Constraint:
    response_format = body["response_format"]
    if response_format["type"] == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT, "")
    schema = response_format["json_schema"]["schema"]
    return Constraint(ConstraintKind.JSON_SCHEMA,
                      json.dumps(with_explicit_openness(schema), ensure_ascii=False))


# ---- structural tag pieces -----------------------------------------------------------------------

def _structural_tag(fmt: dict[str, Any]) -> Constraint:
    spec = json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)
    return Constraint(ConstraintKind.STRUCTURAL_TAG, spec)


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _sequence(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}


def _one_of(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def _json_value(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": with_explicit_openness(schema), "style": "json",
            "max_whitespace_cnt": JSON_MAX_WHITESPACE}


def _with_reasoning(fmt: dict[str, Any], thinking: bool) -> dict[str, Any]:
    if not thinking:
        return fmt
    reasoning = {"type": "tag", "begin": "",
                 "content": {"type": "any_text", "excludes": FREE_TEXT_EXCLUDES},
                 "end": THINK_CLOSE}
    return {"type": "sequence", "elements": [reasoning, fmt]}


def _calls(tools: list[_Tool], parallel: bool) -> dict[str, Any]:
    one_call = _one_of([tool.invoke() for tool in tools])
    return {"type": "plus", "content": one_call} if parallel else one_call


def _block(tools: list[_Tool], parallel: bool) -> dict[str, Any]:
    return _sequence([_const(BLOCK_OPEN), _calls(tools, parallel), _const(BLOCK_CLOSE)])


def _auto_block(tools: list[_Tool], parallel: bool) -> dict[str, Any]:
    """Free text, optionally ending with one tool-call block (then nothing but EOS)."""
    block_tag = {"type": "tag", "begin": BLOCK_OPEN, "content": _calls(tools, parallel),
                 "end": BLOCK_CLOSE}
    return {"type": "triggered_tags", "triggers": [BLOCK_TRIGGER], "tags": [block_tag],
            "excludes": FREE_TEXT_EXCLUDES, "at_least_one": False, "stop_after_first": True}


def _invoke(name: str, parameters: Any, checker: "_SchemaChecker") -> dict[str, Any]:
    params = checker.parameters(parameters)
    return _sequence([_const(f'<{DSML}invoke name="{name}">\n'), _argument_list(params),
                      _const(INVOKE_CLOSE)])


def _argument_list(params: list[tuple[dict[str, Any], bool]]) -> dict[str, Any]:
    """Parameters in schema order, required ones present, optional ones optional.

    Each emitted parameter ends with a newline; when none is emitted the invoke has a blank line.
    The "at least one emitted" branch is spelled out per possible first parameter (only the leading
    optional ones can be first), so the grammar stays exact without named rules.
    """
    if not params:
        return _const("\n")

    def rest(start: int) -> list[dict[str, Any]]:
        return [fmt if required else {"type": "optional", "content": fmt}
                for fmt, required in params[start:]]

    first_choices: list[dict[str, Any]] = []
    for index, (fmt, required) in enumerate(params):
        first_choices.append(_sequence([fmt] + rest(index + 1)))
        if required:
            return _one_of(first_choices)
    return _one_of(first_choices + [_const("\n")])


# ---- schemas -------------------------------------------------------------------------------------

class _SchemaChecker:
    """Checks one tool's (or response format's) schema and turns its parameters into formats.

    Errors name the tool, the schema keyword and the JSON path of the offending node.
    """

    def __init__(self, owner: str, path: str, allow_root_ref: bool = False) -> None:
        self.owner = owner
        self.path = path
        self.allow_root_ref = allow_root_ref
        self.defs: dict[str, Any] = {}

    def error(self, keyword: str, where: str, why: str) -> ConstraintError:
        subject = "response_format" if self.owner == "response_format" else f"tool '{self.owner}'"
        return ConstraintError(f"{subject}: schema keyword '{keyword}' {why}",
                               f"{self.path}{where}")

    def check_document(self, schema: dict[str, Any]) -> None:
        """Checks a whole JSON-value schema (a response format); its root `#` may be referenced."""
        self.defs = {keyword: schema[keyword] for keyword in ("$defs", "definitions")
                     if isinstance(schema.get(keyword), dict)}
        self.check(schema, "")

    def parameters(self, schema: Any) -> list[tuple[dict[str, Any], bool]]:
        """[(parameter format, required)] in schema order."""
        if schema is None:
            return []
        if not isinstance(schema, dict):
            raise self.error("parameters", "", "must be a JSON schema object")
        if schema.get("type", "object") != "object":
            raise self.error("type", ".type", "of tool parameters must be 'object'")
        for keyword in ("$defs", "definitions", "properties"):
            if not isinstance(schema.get(keyword, {}), dict):
                raise self.error(keyword, f".{keyword}", "must be an object")
        if not isinstance(schema.get("required", []), list):
            raise self.error("required", ".required", "must be a list of parameter names")
        for keyword in ("$defs", "definitions"):
            if keyword in schema:
                self.defs[keyword] = schema[keyword]
                for def_name, definition in schema[keyword].items():
                    self.check(definition, f".{keyword}.{def_name}")
        allowed = {"type", "properties", "required", "additionalProperties", "$defs", "definitions",
                   "unevaluatedProperties"} | ANNOTATIONS
        for keyword in schema:
            if keyword not in allowed and not keyword.startswith("x-"):
                raise self.error(keyword, f".{keyword}", "is not supported on tool parameters by "
                                 "constrained decoding")
        if schema.get("unevaluatedProperties", False) not in (False, True):
            raise self.error("unevaluatedProperties", ".unevaluatedProperties",
                             "must be a boolean on tool parameters")
        properties = schema.get("properties") or {}
        required = schema.get("required") or []
        unknown = [name for name in required if name not in properties]
        if unknown:
            raise self.error("required", ".required", f"names undeclared parameter '{unknown[0]}'")
        return [(self.parameter(name, sub), name in required) for name, sub in properties.items()]

    def parameter(self, name: str, schema: Any) -> dict[str, Any]:
        where = f".properties.{name}"
        if not isinstance(name, str) or not name or PARAM_NAME_FORBIDDEN.search(name):
            raise self.error("properties", where, "has a parameter name DSML cannot carry")
        if isinstance(schema, bool):
            schema = {} if schema else None
        if not isinstance(schema, dict):
            raise self.error("properties", where, "must map names to schemas")
        self.check(schema, where)
        resolved = self.resolve(schema, where)
        types = resolved.get("type")
        if _is_raw_string(resolved):
            return self.string_parameter(name, resolved, where)
        if isinstance(types, list) and "string" in types and len(types) > 1 \
                and "enum" not in resolved and "const" not in resolved:
            string_part = {k: v for k, v in resolved.items() if k in RAW_STRING_KEYWORDS}
            string_part["type"] = "string"
            other = dict(resolved, type=[t for t in types if t != "string"])
            return _one_of([self.string_parameter(name, string_part, where),
                            self.json_parameter(name, other)])
        return self.json_parameter(name, schema)

    def json_parameter(self, name: str, schema: dict[str, Any]) -> dict[str, Any]:
        document = dict(schema)
        for keyword, definitions in self.defs.items():
            document.setdefault(keyword, definitions)
        return _sequence([_const(f'<{DSML}parameter name="{name}" string="false">'),
                          _json_value(document), _const(f"{PARAM_CLOSE}\n")])

    def string_parameter(self, name: str, schema: dict[str, Any], where: str) -> dict[str, Any]:
        begin = f'<{DSML}parameter name="{name}" string="true">'
        for keyword in schema:
            if keyword not in RAW_STRING_KEYWORDS and not keyword.startswith("x-"):
                raise self.error(keyword, f"{where}.{keyword}",
                                 "is not supported on a string parameter")
        value = self.raw_string_value(schema, where)
        if value is None:   # free text up to the closing tag
            length = self.length_bounds(schema, where)
            tag = {"type": "tag", "begin": begin, "content": length, "end": PARAM_CLOSE}
            return _sequence([tag, _const("\n")])
        return _sequence([_const(begin), value, _const(f"{PARAM_CLOSE}\n")])

    def raw_string_value(self, schema: dict[str, Any], where: str) -> Optional[dict[str, Any]]:
        """The value format for const/enum/pattern/format strings; None for length-bounded text."""
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            keyword = "const" if "const" in schema else "enum"
            if not isinstance(values, list) or not values \
                    or not all(isinstance(v, str) and PARAM_CLOSE not in v for v in values):
                raise self.error(keyword, f"{where}.{keyword}", "of a string parameter must list "
                                 "strings that do not contain the DSML closing tag")
            return _one_of([_const(value) for value in dict.fromkeys(values)])
        bounded = "minLength" in schema or "maxLength" in schema
        if "pattern" in schema:
            if bounded or "format" in schema:
                raise self.error("pattern", f"{where}.pattern", "cannot be combined with "
                                 "minLength/maxLength/format on a string parameter")
            return {"type": "regex", "pattern": schema["pattern"]}
        if "format" in schema:
            regex = RAW_FORMAT_REGEX.get(schema["format"])
            if regex is None or bounded:
                raise self.error("format", f"{where}.format", f"'{schema['format']}' is not "
                                 "supported on a string parameter" + (" with length bounds"
                                                                       if bounded else ""))
            return {"type": "regex", "pattern": regex}
        return None

    def length_bounds(self, schema: dict[str, Any], where: str) -> dict[str, Any]:
        low = schema.get("minLength", 0)
        high = schema.get("maxLength")
        if not isinstance(low, int) or low < 0 or (high is not None and
                                                   (not isinstance(high, int) or high < low)):
            raise self.error("minLength", f"{where}.minLength",
                             "must be 0 <= minLength <= maxLength")
        text: dict[str, Any] = {"type": "any_text", "excludes": RAW_STRING_EXCLUDES}
        if high is not None:
            text["max_chars"] = high - low
        if low == 0:
            return text
        return {"type": "sequence", "elements": [{"type": "regex", "pattern": f"[^<]{{{low}}}"},
                                                 text]}

    def resolve(self, schema: dict[str, Any], where: str) -> dict[str, Any]:
        """Follows a chain of local `$ref`s (to $defs / definitions)."""
        seen = set()
        while "$ref" in schema and schema["$ref"] != "#":
            ref = schema["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#/"):
                raise self.error("$ref", f"{where}.$ref", "must point into $defs or definitions")
            if ref in seen:
                raise self.error("$ref", f"{where}.$ref", "is circular")
            seen.add(ref)
            parts = ref[2:].split("/")
            target: Any = self.defs.get(parts[0], {})
            for part in parts[1:]:
                target = target.get(part) if isinstance(target, dict) else None
            if not isinstance(target, dict):
                raise self.error("$ref", f"{where}.$ref", f"'{ref[:80]}' does not resolve")
            schema = target
        return schema

    def check(self, schema: Any, where: str) -> None:
        """Rejects keywords XGrammar would ignore (loosening the schema) anywhere in `schema`."""
        if isinstance(schema, bool):
            return
        if not isinstance(schema, dict):
            raise self.error("schema", where, "must be an object or a boolean")
        for keyword, value in schema.items():
            self.check_keyword(keyword, value, schema, f"{where}.{keyword}")
        for keyword in ("properties", "$defs", "definitions"):
            if not isinstance(schema.get(keyword, {}), dict):
                raise self.error(keyword, f"{where}.{keyword}", "must be an object")
            for name, sub in (schema.get(keyword) or {}).items():
                self.check(sub, f"{where}.{keyword}.{name}")
        for keyword in ("items", "additionalProperties", "contains", "propertyNames",
                        "unevaluatedProperties", "unevaluatedItems"):
            if isinstance(schema.get(keyword), dict):
                self.check(schema[keyword], f"{where}.{keyword}")
        for keyword in ("prefixItems", "anyOf", "allOf", "oneOf"):
            for index, sub in enumerate(schema.get(keyword) or []):
                self.check(sub, f"{where}.{keyword}[{index}]")

    def check_keyword(self, keyword: str, value: Any, schema: dict[str, Any], where: str) -> None:
        if keyword in IGNORED_BY_XGRAMMAR:
            raise self.error(keyword, where, "is not enforced by the grammar engine (XGrammar "
                             "0.2.7 would silently ignore it)")
        if keyword == "uniqueItems" and value is True:
            raise self.error(keyword, where, "is not enforced by the grammar engine")
        if keyword == "allOf" and (not isinstance(value, list) or len(value) != 1):
            raise self.error(keyword, where, "with more than one branch is not enforced by the "
                             "grammar engine")
        if keyword == "oneOf" and not self.disjoint(value, where):
            raise self.error(keyword, where, "needs branches of distinct types or distinct "
                             "discriminator constants (the grammar engine treats it as anyOf)")
        integer_step = isinstance(value, int) and schema.get("type") == "integer"
        if keyword == "multipleOf" and not integer_step:
            raise self.error(keyword, where, "is only enforced for integer types with an integer "
                             "divisor")
        if keyword == "format" and value not in XGRAMMAR_FORMATS:
            raise self.error(keyword, where, f"'{str(value)[:40]}' is not enforced by the grammar "
                             "engine")
        if keyword == "items" and not isinstance(value, (dict, bool)):
            raise self.error(keyword, where, "must be a schema (use prefixItems for tuples)")
        if keyword == "$ref":
            local = isinstance(value, str) and (value.startswith("#/$defs/")
                                                or value.startswith("#/definitions/"))
            if not (local or (self.allow_root_ref and value == "#")):
                raise self.error(keyword, where, "must point into $defs or definitions")
            siblings = set(schema) - ANNOTATIONS - {"$ref", "$defs", "definitions"}
            if siblings:
                raise self.error(keyword, where, f"with sibling keyword '{sorted(siblings)[0]}' is "
                                 "not enforced by the grammar engine (siblings are ignored)")

    def disjoint(self, branches: Any, where: str) -> bool:
        """True when no value can match two `oneOf` branches (so anyOf semantics are exact)."""
        if not isinstance(branches, list) or not branches:
            return False
        resolved = [self.resolve(b, where) if isinstance(b, dict) else None for b in branches]
        if any(b is None for b in resolved):
            return False
        types = [b.get("type") for b in resolved]
        if all(isinstance(t, str) for t in types) and len(set(types)) == len(types) \
                and not {"integer", "number"} <= set(types):
            return True
        return _distinct_discriminator(resolved)


def _distinct_discriminator(branches: list[dict[str, Any]]) -> bool:
    """Object branches that each require one shared property with a distinct constant value."""
    first = branches[0].get("properties") or {}
    for name in first:
        constants = []
        for branch in branches:
            prop = (branch.get("properties") or {}).get(name)
            if not isinstance(prop, dict) or name not in (branch.get("required") or []):
                break
            if "const" in prop:
                constants.append(json.dumps(prop["const"], sort_keys=True))
            elif isinstance(prop.get("enum"), list) and len(prop["enum"]) == 1:
                constants.append(json.dumps(prop["enum"][0], sort_keys=True))
            else:
                break
        else:
            if len(set(constants)) == len(constants):
                return True
    return False


def _is_raw_string(schema: dict[str, Any]) -> bool:
    """String-typed: `type: "string"`, or an untyped enum/const of strings only."""
    if schema.get("type") == "string":
        return True
    if "type" in schema:
        return False
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    return isinstance(values, list) and bool(values) and all(isinstance(v, str) for v in values) \
        and set(schema) <= RAW_STRING_KEYWORDS
