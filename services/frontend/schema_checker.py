"""Checks the JSON schemas of a constrained request before any grammar is built.

Two jobs, in one walk over every sub-schema:
- refuse keywords XGrammar 0.2.7 would silently ignore (they would loosen the schema);
- bound the work the grammar compile will do: nesting depth, sub-schemas, properties and enum
  values of the whole request (`SchemaBudget`), and the values of length/count keywords.
Errors name the tool (or response_format), the keyword and the JSON path of the offending node.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from services.common.config import SchemaBounds
from services.frontend.errors import ConstraintError
from services.frontend.schema_keywords import (ANNOTATIONS, IGNORED_BY_XGRAMMAR, SIZE_KEYWORDS,
                                               SUBSCHEMA_KEYWORDS, XGRAMMAR_FORMATS)


class SchemaBudget:
    """What the schemas of one request have used so far, against `bounds` (shared by its tools)."""

    def __init__(self, bounds: SchemaBounds) -> None:
        self.bounds = bounds
        self.nodes = 0
        self.properties = 0
        self.enum_values = 0

    def enter(self, path: str, depth: int) -> None:
        """One more sub-schema at nesting `depth` (the tool's parameters object is depth 1)."""
        if depth > self.bounds.max_depth:
            raise ConstraintError(f"the schema is nested deeper than {self.bounds.max_depth} levels "
                                  f"(limit {self.bounds.max_depth})", path)
        self.nodes += 1
        if self.nodes > self.bounds.max_nodes:
            raise ConstraintError(f"the request's schemas have more than {self.bounds.max_nodes} "
                                  f"sub-schemas (limit {self.bounds.max_nodes})", path)

    def add_properties(self, count: int, path: str) -> None:
        self.properties += count
        self._check_total(self.properties, self.bounds.max_properties, "declare", "properties", path)

    def add_enum_values(self, count: int, path: str) -> None:
        self.enum_values += count
        self._check_total(self.enum_values, self.bounds.max_enum_values, "list", "enum values",
                          path)

    @staticmethod
    def _check_total(total: int, limit: int, verb: str, what: str, path: str) -> None:
        if total > limit:
            raise ConstraintError(f"the request's schemas {verb} more than {limit} {what} in "
                                  f"total (limit {limit})", path)


class SchemaChecker:
    """Checks one tool's (or the response format's) schema; `defs` are its $defs / definitions."""

    def __init__(self, owner: str, path: str, budget: SchemaBudget,
                 allow_root_ref: bool = False) -> None:
        self.owner = owner
        self.path = path
        self.budget = budget
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
        self.check(schema, "", depth=1)

    def check(self, schema: Any, where: str, depth: int) -> None:
        """Rejects keywords XGrammar would ignore (loosening the schema) anywhere in `schema`."""
        if isinstance(schema, bool):
            self.budget.enter(f"{self.path}{where}", depth)
            return
        if not isinstance(schema, dict):
            raise self.error("schema", where, "must be an object or a boolean")
        self.budget.enter(f"{self.path}{where}", depth)
        for keyword, value in schema.items():
            self.check_keyword(keyword, value, schema, f"{where}.{keyword}")
        for sub_where, sub in self.subschemas(schema, where):
            self.check(sub, sub_where, depth + 1)

    def subschemas(self, schema: dict[str, Any], where: str) -> Iterator[tuple[str, Any]]:
        """(path, sub-schema) of every schema-valued keyword of `schema`."""
        for keyword, shape in SUBSCHEMA_KEYWORDS.items():
            if keyword not in schema:
                continue
            value, at = schema[keyword], f"{where}.{keyword}"
            if shape == "map":
                if not isinstance(value, dict):
                    raise self.error(keyword, at, "must be an object")
                if keyword == "properties":
                    self.budget.add_properties(len(value), f"{self.path}{at}")
                yield from ((f"{at}.{name}", sub) for name, sub in value.items())
            elif shape == "list":
                if not isinstance(value, list):
                    raise self.error(keyword, at, "must be a list of schemas")
                yield from ((f"{at}[{index}]", sub) for index, sub in enumerate(value))
            elif isinstance(value, dict):
                yield at, value

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
            self.check_ref(value, schema, where)
        self.check_size(keyword, value, where)

    def check_size(self, keyword: str, value: Any, where: str) -> None:
        """Enum lengths count towards the request's budget; length/count keywords are bounded."""
        if keyword == "enum" and isinstance(value, list):
            self.budget.add_enum_values(len(value), f"{self.path}{where}")
        limit = self.budget.bounds.max_length_keyword
        if keyword in SIZE_KEYWORDS and isinstance(value, int) and value > limit:
            raise self.error(keyword, where, f"is {value}, over the server's limit of {limit}")

    def check_ref(self, value: Any, schema: dict[str, Any], where: str) -> None:
        local = isinstance(value, str) and (value.startswith("#/$defs/")
                                            or value.startswith("#/definitions/"))
        if not (local or (self.allow_root_ref and value == "#")):
            raise self.error("$ref", where, "must point into $defs or definitions")
        siblings = set(schema) - ANNOTATIONS - {"$ref", "$defs", "definitions"}
        if siblings:
            raise self.error("$ref", where, f"with sibling keyword '{sorted(siblings)[0]}' is "
                             "not enforced by the grammar engine (siblings are ignored)")

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
    if not isinstance(first, dict):
        return False
    for name in first:
        constants = []
        for branch in branches:
            props = branch.get("properties")
            prop = props.get(name) if isinstance(props, dict) else None
            required = branch.get("required")
            if not isinstance(prop, dict) or not isinstance(required, list) \
                    or name not in required:
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
