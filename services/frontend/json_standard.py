"""`json.loads` of standard JSON only: without Python's extensions (`NaN`, `Infinity`) and without
numbers that overflow a double, which no JSON client can read back."""
from __future__ import annotations

import json
from typing import Any, Union


def loads_standard(text: Union[str, bytes]) -> Any:
    """Raises ValueError (JSONDecodeError included) for anything but standard JSON."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]} overflows a double")
    return value
