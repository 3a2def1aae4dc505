"""The text a call example is built from: the declared tool's JSON, a template's placeholders, a
value as the request says it, the string values a call copies, and thinking mode's reasoning."""
from __future__ import annotations

import json
import random
from typing import Any

from services.demo.tools import ToolSpec


def tool_json(spec: ToolSpec, rng: random.Random, held_out: bool) -> dict[str, Any]:
    """The declared tool: required parameters always, each optional one with probability 0.7."""
    params = [p for p in spec.params if p.name in spec.required or rng.random() < 0.7]
    parameters: dict[str, Any] = {"type": "object",
                                  "properties": {p.name: p.schema for p in params},
                                  "required": list(spec.required)}
    if rng.random() < 0.6:
        parameters["additionalProperties"] = False
    function: dict[str, Any] = {"name": spec.name, "description": spec.description,
                                "parameters": parameters}
    if rng.random() < 0.5:
        function["strict"] = True
    return {"type": "function", "function": function}


def placeholders(template: str, spec: ToolSpec) -> list[str]:
    """The parameters `template` names, in the tool's order."""
    return [p.name for p in spec.params if "{" + p.name + "}" in template]


def surface_of(value: Any) -> str:
    """`value` as a request says it: a list as "a, b and c", a string bare, others as JSON."""
    if isinstance(value, list):
        items = [str(v) for v in value]
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return value if isinstance(value, str) else json.dumps(value)


def string_values(args: dict[str, Any]) -> list[str]:
    """Every string among the arguments' values, list items included."""
    found: list[str] = []
    for value in args.values():
        found.extend(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str))
    return found


def call_reasoning(spec: ToolSpec, args: dict[str, Any]) -> str:
    """Thinking mode's short reasoning span before a call."""
    details = ", ".join(f"{key} {surface_of(value)}" for key, value in args.items())
    return f"The user wants {spec.name} with {details}. I will call the tool."
