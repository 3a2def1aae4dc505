"""Which DSML parameter values are raw strings: the declared schema decides, the flag is a hint.

A parameter declared `"type": "string"` (or a string-only enum) is the raw text between the tags, even
when the model wrote `string="false"`; a parameter declared with any other type is JSON, even under
`string="true"`. When the tool or parameter is unknown, or the type is a union that includes
"string", the model's `string="true|false"` flag decides.
"""
from __future__ import annotations

from typing import Any, Optional


class ParameterTyping:
    def __init__(self, tools: Optional[list[dict[str, Any]]]) -> None:
        self._declared: dict[str, dict[str, Optional[bool]]] = {}
        for tool in tools or []:
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                self._declared[function["name"]] = _declared_kinds(function.get("parameters"))

    def is_raw_string(self, tool_name: str, parameter: str, flag_says_string: bool) -> bool:
        declared = self._declared.get(tool_name, {}).get(parameter)
        return flag_says_string if declared is None else declared


def _declared_kinds(parameters: Any) -> dict[str, Optional[bool]]:
    if not isinstance(parameters, dict) or not isinstance(parameters.get("properties"), dict):
        return {}
    return {name: _is_string_schema(schema) for name, schema in parameters["properties"].items()}


def _is_string_schema(schema: Any) -> Optional[bool]:
    """True: string only; False: never a string; None: cannot tell (the flag decides)."""
    if not isinstance(schema, dict):
        return None
    declared = schema.get("type")
    if isinstance(declared, str):
        return declared == "string"
    if isinstance(declared, list) and declared:
        if "string" not in declared:
            return False
        return True if declared == ["string"] else None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        if all(isinstance(v, str) for v in enum):
            return True
        if not any(isinstance(v, str) for v in enum):
            return False
    return None
