"""Flag value parsers (argparse `type=`): each error message follows "argument --flag:"."""
from __future__ import annotations

import argparse
import json
import re
from typing import Any, Optional

from services.common.config import GenerateDefaults, SpeculativeConfig

DSPARK_METHOD = "dspark"
MTP_METHOD = "mtp"
# Largest K per method: DSpark drafts one block (the checkpoint's dspark_block_size may lower it,
# checked against the model at startup); MTP chains its one block K times, and its guesses degrade
# with each link, so K stops at the guide's K = 7 (the demo model without a grammar: 92% of drafts
# accepted at position 1, 30% at position 7; docs/demo-model.md).
MAX_SPECULATIVE_TOKENS = {DSPARK_METHOD: 15, MTP_METHOD: 7}


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number of seconds, got {text!r}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_size(text: str) -> int:
    """Bytes: `1073741824`, `512MiB`, `4GiB`, `2G` (binary multiples)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if match is None or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"must be a positive size such as 4GiB or 536870912, got {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def device_list(text: str) -> tuple[int, ...]:
    """`0,1,2,3` → (0, 1, 2, 3); ids are non-negative and distinct."""
    try:
        devices = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated device ids such as 0,1,2,3, got {text!r}") from None
    if any(d < 0 for d in devices) or len(set(devices)) != len(devices):
        raise argparse.ArgumentTypeError(f"device ids must be distinct and non-negative, got {text!r}")
    return devices


def rank_set(text: str) -> tuple[int, ...]:
    """`0-7`, `8-15`, `0,1,4-5` → ascending distinct global ranks."""
    ranks: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            ranks.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must list ranks such as 0-7 or 0,1,2, got {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"must list non-negative ranks such as 0-7, got {text!r}")
    return tuple(sorted(ranks))
def path_list(text: str) -> tuple[str, ...]:
    """Comma-separated URL paths, each starting with '/'; '' is the empty list."""
    paths = tuple(part.strip() for part in text.split(",") if part.strip())
    bad = [path for path in paths if not path.startswith("/")]
    if bad:
        raise argparse.ArgumentTypeError(f"paths must start with '/': {bad[0]!r}")
    return paths


def address_list(text: str) -> tuple[str, ...]:
    """`host:port,host:port` → a tuple of addresses."""
    addresses = tuple(part.strip() for part in text.split(",") if part.strip())
    if not addresses:
        raise argparse.ArgumentTypeError("must list at least one host:port")
    return tuple(address(a) for a in addresses)


def address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"must be host:port, got {text!r}")
    return text


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON ({exc.msg} at position {exc.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def speculative_config(text: str) -> SpeculativeConfig:
    """`{"method":"dspark","num_speculative_tokens":7}` or `{"method":"mtp",...}`; K = 0 means
    target-only decoding."""
    value = json_object(text)
    _reject_unknown_keys(value, {"method", "num_speculative_tokens"})
    method = value.get("method")
    if method not in MAX_SPECULATIVE_TOKENS:
        raise argparse.ArgumentTypeError(f'"method" must be "{DSPARK_METHOD}" or "{MTP_METHOD}", '
                                         f'got {method!r}')
    k = value.get("num_speculative_tokens")
    limit = MAX_SPECULATIVE_TOKENS[method]
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= limit:
        raise argparse.ArgumentTypeError(f'"num_speculative_tokens" must be an integer in '
                                         f'[0, {limit}] for method {method}, got {k!r}')
    return SpeculativeConfig(method=method, num_speculative_tokens=k)


def generate_config(text: str) -> GenerateDefaults:
    """`{"max_new_tokens":2048,"temperature":0}`: request defaults. Only greedy decoding exists."""
    value = json_object(text)
    _reject_unknown_keys(value, {"max_new_tokens", "temperature"})
    defaults = GenerateDefaults()
    max_new = value.get("max_new_tokens", defaults.max_new_tokens)
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1:
        raise argparse.ArgumentTypeError(f'"max_new_tokens" must be a positive integer, got {max_new!r}')
    temperature = value.get("temperature", defaults.temperature)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature != 0:
        raise argparse.ArgumentTypeError(
            f'"temperature" must be 0: only greedy decoding is supported, got {temperature!r}')
    return GenerateDefaults(max_new_tokens=max_new, temperature=float(temperature))


def _reject_unknown_keys(value: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(value) - known)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown key(s) {unknown}; known: {sorted(known)}")


def dtype_choice(text: str) -> Optional[str]:
    if text == "auto":
        return None
    if text not in ("float32", "bfloat16"):
        raise argparse.ArgumentTypeError(f"must be auto, float32 or bfloat16, got {text!r}")
    return text
