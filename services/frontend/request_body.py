"""A request body, read and decoded within the server's bounds before any route looks at it.

- Size: a declared `Content-Length` over the limit is refused before a byte is read, and a body
  streamed without one is refused as soon as it passes the limit (413): nothing bigger than the
  limit is ever buffered or parsed.
- Nesting: brackets outside strings are counted on the raw bytes (escapes and strings are cut out,
  numpy sums the brackets) before `json.loads`, whose recursion would otherwise fail past ~1,000 levels.
- JSON proper: `NaN`/`Infinity` (a Python extension) and numbers that overflow a double are refused.
- Text: a lone UTF-16 surrogate (`"\\ud800"`) decodes to a Python string that cannot be encoded as
  UTF-8 (the tokenizer and the JSON response writer both fail on it); it is a 400 naming the field.
"""
from __future__ import annotations

import re
from typing import Any, Iterator, Optional, Union

import numpy as np
from starlette.requests import Request

from services.frontend.errors import RequestError
from services.frontend.json_standard import loads_standard

_STRING = re.compile(rb'"[^"]*"')
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[[ord("{"), ord("[")]] = 1
_BRACKET_STEP[[ord("}"), ord("]")]] = -1
# A `\ud800`-`\udfff` escape: only these can put a surrogate into a decoded string (raw UTF-8
# surrogate bytes already fail to decode).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_DECLARED_LENGTH_DIGITS = 18


class BodyTooLarge(RequestError):
    status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than the server's limit of {limit} bytes.",
                         None, "request_too_large")


class JsonTooDeep(RequestError):
    def __init__(self, depth: int, limit: int, param: Optional[str]) -> None:
        where = f"`{param}`" if param else "The request body"
        super().__init__(f"{where} nests JSON {depth} levels deep; the server's limit is {limit}.",
                         param)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or `BodyTooLarge` as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) > MAX_DECLARED_LENGTH_DIGITS or int(declared) > limit):
        raise BodyTooLarge(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def nesting_depth(raw: bytes) -> int:
    """The deepest bracket nesting of JSON text, strings excluded (exact for valid JSON)."""
    # Escaped backslashes first, then escaped quotes: what is left of a string has no escapes.
    structure = _STRING.sub(b"", raw.replace(b"\\\\", b"").replace(b'\\"', b""))
    if not structure:
        return 0
    steps = _BRACKET_STEP[np.frombuffer(structure, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def decode_json_object(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The body as a JSON object, or a `RequestError` (400) saying what is wrong with it."""
    body = loads_bounded(raw, max_depth, None)
    if not isinstance(body, dict):
        raise RequestError(f"The request body must be a JSON object, not {_json_type(body)}.")
    if _SURROGATE_ESCAPE.search(raw):
        _reject_surrogates(body)
    return body


def loads_bounded(text: Union[bytes, str], max_depth: int, param: Optional[str]) -> Any:
    """`json.loads` of standard JSON nested at most `max_depth` deep; `param` names it in errors."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise JsonTooDeep(depth, max_depth, param)
    try:
        return loads_standard(text)
    except (ValueError, RecursionError) as error:   # JSONDecodeError is a ValueError
        where = f"`{param}` is" if param else "The request body is"
        raise RequestError(f"{where} not valid JSON: {str(error)[:120]}", param) from None


def _reject_surrogates(body: dict[str, Any]) -> None:
    for path, text in _strings(body, ""):
        if _SURROGATE.search(text):
            raise RequestError(f"`{path or 'body'}` contains a lone UTF-16 surrogate "
                               "(an unpaired \\ud800-\\udfff escape), which is not valid Unicode "
                               "text.", path or None)


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(JSON path, string) of every key and string value, depth first, without recursion."""
    stack = [(path, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            yield where, node
        elif isinstance(node, dict):
            for key, child in node.items():
                name = _SURROGATE.sub(_escaped, key[:40])
                child_path = f"{where}.{name}" if where else name
                yield child_path, key
                stack.append((child_path, child))
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(node))


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
