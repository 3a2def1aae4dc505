"""One tool's parameters schema → the structural-tag format of each DSML parameter.

The `string` flag of every parameter is fixed by its schema type (unlike XGrammar's built-in
`deepseek_v4` template, where it is free): a string-typed parameter is `string="true"` + raw text
(never containing the closing tag), anything else is `string="false"` + JSON for that sub-schema.

- Only declared parameters are ever generated. When `additionalProperties` is not `false`, unknown
  parameters would be allowed by the schema but cannot be typed, so the grammar offers none (the
  output stays valid; it merely never uses that freedom).
- Raw string parameters: `minLength` is met by `minLength` leading characters that are not `<`
  (so the closing tag cannot start inside them); `pattern` is matched in full (XGrammar anchors it);
  `format` supports date, time, date-time, email, uuid, ipv4, hostname and http(s) uri through
  conservative regexes (every match is valid, not every valid value matches).
- Known limit: a JSON value (`string="false"`) may itself contain the text `</｜DSML｜parameter>`
  inside a JSON string; a parser that cuts at the first closing tag (rather than parsing the JSON
  value) would then split it wrongly. Raw string values can never contain it.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from services.frontend import structural_tag as st
from services.frontend.schema_checker import SchemaChecker
from services.frontend.schema_keywords import ANNOTATIONS, RAW_FORMAT_REGEX, RAW_STRING_KEYWORDS

PARAM_NAME_FORBIDDEN = re.compile(r"[\"<>\n\r]")
PARAMETERS_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "$defs",
                                 "definitions", "unevaluatedProperties"}) | ANNOTATIONS


class ParameterFormats:
    """Turns a tool's `parameters` into [(parameter format, required)], checking as it goes."""

    def __init__(self, checker: SchemaChecker) -> None:
        self.checker = checker

    def parameters(self, schema: Any) -> list[tuple[st.Format, bool]]:
        """[(parameter format, required)] in schema order."""
        if schema is None:
            return []
        self.check_root(schema)
        properties = schema.get("properties") or {}
        required = schema.get("required") or []
        unknown = [name for name in required if name not in properties]
        if unknown:
            raise self.checker.error("required", ".required",
                                     f"names undeclared parameter '{str(unknown[0])[:64]}'")
        return [(self.parameter(name, sub), name in required) for name, sub in properties.items()]

    def check_root(self, schema: Any) -> None:
        """The parameters object itself: an object schema the DSML block can express."""
        checker = self.checker
        if not isinstance(schema, dict):
            raise checker.error("parameters", "", "must be a JSON schema object")
        checker.budget.enter(checker.path, depth=1)
        if schema.get("type", "object") != "object":
            raise checker.error("type", ".type", "of tool parameters must be 'object'")
        for keyword in ("$defs", "definitions", "properties"):
            if not isinstance(schema.get(keyword, {}), dict):
                raise checker.error(keyword, f".{keyword}", "must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise checker.error("required", ".required", "must be a list of parameter names")
        for keyword in ("$defs", "definitions"):
            if keyword in schema:
                checker.defs[keyword] = schema[keyword]
                for def_name, definition in schema[keyword].items():
                    checker.check(definition, f".{keyword}.{def_name}", depth=2)
        for keyword in schema:
            if keyword not in PARAMETERS_KEYWORDS and not keyword.startswith("x-"):
                raise checker.error(keyword, f".{keyword}", "is not supported on tool parameters "
                                    "by constrained decoding")
        if schema.get("unevaluatedProperties", False) not in (False, True):
            raise checker.error("unevaluatedProperties", ".unevaluatedProperties",
                                "must be a boolean on tool parameters")
        checker.budget.add_properties(len(schema.get("properties") or {}),
                                      f"{checker.path}.properties")

    def parameter(self, name: str, schema: Any) -> st.Format:
        where = f".properties.{name}"
        if not name or PARAM_NAME_FORBIDDEN.search(name):
            raise self.checker.error("properties", where, "has a parameter name DSML cannot carry")
        if isinstance(schema, bool):
            schema = {} if schema else None
        if not isinstance(schema, dict):
            raise self.checker.error("properties", where, "must map names to schemas")
        self.checker.check(schema, where, depth=2)
        resolved = self.checker.resolve(schema, where)
        types = resolved.get("type")
        if _is_raw_string(resolved):
            return self.string_parameter(name, resolved, where)
        if isinstance(types, list) and "string" in types and len(types) > 1 \
                and "enum" not in resolved and "const" not in resolved:
            string_part = {k: v for k, v in resolved.items() if k in RAW_STRING_KEYWORDS}
            string_part["type"] = "string"
            other = dict(resolved, type=[t for t in types if t != "string"])
            return st.one_of([self.string_parameter(name, string_part, where),
                              self.json_parameter(name, other)])
        return self.json_parameter(name, schema)

    def json_parameter(self, name: str, schema: dict[str, Any]) -> st.Format:
        document = dict(schema)
        for keyword, definitions in self.checker.defs.items():
            document.setdefault(keyword, definitions)
        return st.sequence([st.const(f'<{st.DSML}parameter name="{name}" string="false">'),
                            st.json_value(document), st.const(f"{st.PARAM_CLOSE}\n")])

    def string_parameter(self, name: str, schema: dict[str, Any], where: str) -> st.Format:
        begin = f'<{st.DSML}parameter name="{name}" string="true">'
        for keyword in schema:
            if keyword not in RAW_STRING_KEYWORDS and not keyword.startswith("x-"):
                raise self.checker.error(keyword, f"{where}.{keyword}",
                                         "is not supported on a string parameter")
        value = self.raw_string_value(schema, where)
        if value is None:   # free text up to the closing tag
            tag = {"type": "tag", "begin": begin, "content": self.length_bounds(schema, where),
                   "end": st.PARAM_CLOSE}
            return st.sequence([tag, st.const("\n")])
        return st.sequence([st.const(begin), value, st.const(f"{st.PARAM_CLOSE}\n")])

    def raw_string_value(self, schema: dict[str, Any], where: str) -> Optional[st.Format]:
        """The value format for const/enum/pattern/format strings; None for length-bounded text."""
        error = self.checker.error
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            keyword = "const" if "const" in schema else "enum"
            if not isinstance(values, list) or not values \
                    or not all(isinstance(v, str) and st.PARAM_CLOSE not in v for v in values):
                raise error(keyword, f"{where}.{keyword}", "of a string parameter must list "
                            "strings that do not contain the DSML closing tag")
            return st.one_of([st.const(value) for value in dict.fromkeys(values)])
        bounded = "minLength" in schema or "maxLength" in schema
        if "pattern" in schema:
            if bounded or "format" in schema or not isinstance(schema["pattern"], str):
                raise error("pattern", f"{where}.pattern", "must be a string and cannot be "
                            "combined with minLength/maxLength/format on a string parameter")
            return {"type": "regex", "pattern": schema["pattern"]}
        if "format" in schema:
            regex = RAW_FORMAT_REGEX.get(schema["format"])
            if regex is None or bounded:
                raise error("format", f"{where}.format", f"'{str(schema['format'])[:40]}' is not "
                            "supported on a string parameter" + (" with length bounds"
                                                                  if bounded else ""))
            return {"type": "regex", "pattern": regex}
        return None

    def length_bounds(self, schema: dict[str, Any], where: str) -> st.Format:
        low = schema.get("minLength", 0)
        high = schema.get("maxLength")
        if not _is_int(low) or low < 0 or (high is not None and (not _is_int(high) or high < low)):
            raise self.checker.error("minLength", f"{where}.minLength",
                                     "must be 0 <= minLength <= maxLength")
        text: dict[str, Any] = {"type": "any_text", "excludes": st.RAW_STRING_EXCLUDES}
        if high is not None:
            text["max_chars"] = high - low
        if low == 0:
            return text
        return {"type": "sequence", "elements": [{"type": "regex", "pattern": f"[^<]{{{low}}}"},
                                                 text]}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_raw_string(schema: dict[str, Any]) -> bool:
    """String-typed: `type: "string"`, or an untyped enum/const of strings only."""
    if schema.get("type") == "string":
        return True
    if "type" in schema:
        return False
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    return isinstance(values, list) and bool(values) and all(isinstance(v, str) for v in values) \
        and set(schema) <= RAW_STRING_KEYWORDS
