"""JSON Schema's implicit openness, written out for XGrammar.

XGrammar 0.2.7 compiles every JSON schema in strict mode (a structural tag's JSON value has no switch
to turn it off): an object that declares `properties` admits no other key, and an array with
`prefixItems` admits no further item, unless the schema says so explicitly (measured:
`{"properties": {"a": …}}` refused `{"a": 1, "z": 2}`; with `"additionalProperties": true` it was
accepted). JSON Schema, and the API contract ("a schema needs `additionalProperties: false` to
exclude unknown fields: constrain exactly what the schema says"), allow them. So before a schema
reaches XGrammar, every object with `properties` but no `additionalProperties` /
`unevaluatedProperties`, and every array with `prefixItems` but no `items` / `unevaluatedItems`, gets
the JSON Schema default (`true`) written out. Nothing else changes; values that are data rather than
schemas (`enum`, `const`, `default`, `examples`, …) are never entered.
"""
from __future__ import annotations

from typing import Any

# Keywords whose value is one schema, a map of name → schema, or a list of schemas.
SCHEMA_KEYWORDS = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems",
                   "propertyNames", "contains", "not", "if", "then", "else")
SCHEMA_MAP_KEYWORDS = ("properties", "patternProperties", "dependentSchemas", "$defs",
                       "definitions")
SCHEMA_LIST_KEYWORDS = ("prefixItems", "anyOf", "oneOf", "allOf")


def with_explicit_openness(schema: Any) -> Any:
    """A copy of `schema` with the implicit `additionalProperties` / `items` defaults written out."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for keyword in SCHEMA_KEYWORDS:
        if keyword in out:
            out[keyword] = with_explicit_openness(out[keyword])
    for keyword in SCHEMA_MAP_KEYWORDS:
        if isinstance(out.get(keyword), dict):
            out[keyword] = {name: with_explicit_openness(sub) for name, sub in out[keyword].items()}
    for keyword in SCHEMA_LIST_KEYWORDS:
        if isinstance(out.get(keyword), list):
            out[keyword] = [with_explicit_openness(sub) for sub in out[keyword]]
    if "properties" in out and not {"additionalProperties", "unevaluatedProperties"} & out.keys():
        out["additionalProperties"] = True
    if "prefixItems" in out and not {"items", "unevaluatedItems"} & out.keys():
        out["items"] = True
    return out
