"""What XGrammar 0.2.7 enforces of JSON Schema, as tables the schema checker consults.

Keywords XGrammar ignores would silently loosen a schema, so the checker refuses them; formats and
regexes here are what a raw (`string="true"`) parameter may use.
"""
from __future__ import annotations

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
# Length and count keywords: XGrammar compiles them into bounded repetitions whose cost grows with
# the bound (measured on 2 cores: a raw string with minLength 100,000 took 6.8 s, maxLength 100,000
# 1.6 s, a JSON string with minLength 50,000 3.4 s), so their values are bounded.
SIZE_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties",
                 "maxProperties")
# Where sub-schemas live: keyword → "one" (a schema), "map" (name → schema), "list" (schemas).
SUBSCHEMA_KEYWORDS = {
    "items": "one", "additionalProperties": "one", "contains": "one", "propertyNames": "one",
    "unevaluatedProperties": "one", "unevaluatedItems": "one",
    "properties": "map", "$defs": "map", "definitions": "map",
    "prefixItems": "list", "anyOf": "list", "allOf": "list", "oneOf": "list",
}

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
