"""Length limits of raw-string DSML parameters, lifted out of the structural tag before compiling.

The frontend spells `maxLength` of a `string="true"` parameter as `any_text.max_chars` inside the
parameter's tag (services/frontend/parameter_formats.py). XGrammar 0.2.7 implements `max_chars` as
a character budget, and one budgeted rule anywhere turns off its compile-time shortcuts for the whole
grammar (no speculative token classification, no rule-level cache, every token edge rechecked at
run time). Measured on the shared 2-core machine (bench/bench_grammar.py, 10 corpus tools, thinking,
required): 2.0-3.2 s cold with the two `maxLength` strings, 0.26-0.32 s without them; a budgeted
position costs 28 ms per mask fill instead of ~2 µs.

So the scheduler compiles the tag with those `max_chars` removed and enforces each limit itself
(raw_string_guard.py) on the text of the tokens it accepts. The accepted language is unchanged: the
limit counts code points of the value, as `max_chars` does (a `[^<]{n}` minLength prefix counts too:
its n characters plus `max_chars` is the maxLength), and the value can be located in the output text
exactly, because every text the grammar lets through outside markup (free text, raw strings) excludes
`｜DSML｜`, and JSON values cannot hold the markers' unescaped quotes.

Only the frontend's shape is lifted: a `tag` with begin `<｜DSML｜parameter name="P" string="true">`,
end `</｜DSML｜parameter>` and an `any_text` content excluding `｜DSML｜`, inside an invoke's
`sequence` that starts with `<｜DSML｜invoke name="T">\\n`. Anything else keeps its `max_chars` and
XGrammar enforces it, as does a (tool, parameter) that carries two different limits.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

DSML = "｜DSML｜"
PARAM_CLOSE = f"</{DSML}parameter>"
INVOKE_HEAD = re.compile(f'^<{DSML}invoke name="([^"]*)">\n$')
STRING_PARAM_BEGIN = re.compile(f'^<{DSML}parameter name="[^"]*" string="true">$')
MIN_LENGTH_PREFIX = re.compile(r"^\[\^<\]\{([0-9]+)\}$")

LimitKey = tuple[str, str]   # (tool name, the parameter's begin text)


@dataclass(frozen=True)
class LiftedSpec:
    """The structural tag to compile, and the limits taken out of it."""

    spec: str
    # (tool, parameter begin text) → the most code points its value may have.
    max_chars: dict[LimitKey, int] = field(default_factory=dict)
    # Every tool the grammar can invoke (the guard recognizes their headers in the output).
    invoke_names: frozenset[str] = frozenset()


def lift_raw_string_limits(spec: str) -> LiftedSpec:
    """`spec` with the liftable `max_chars` removed, and those limits; `spec` itself if none."""
    if "max_chars" not in spec:
        return LiftedSpec(spec)
    try:
        document = json.loads(spec)
    except ValueError:
        return LiftedSpec(spec)   # XGrammar reports the error on the text as given
    found = list(_limited_params(document, tool=None))
    limits: dict[LimitKey, set[int]] = {}
    for key, limit, _ in found:
        limits.setdefault(key, set()).add(limit)
    lifted = {key: next(iter(values)) for key, values in limits.items() if len(values) == 1}
    if not lifted:
        return LiftedSpec(spec)
    for key, _, text_format in found:
        if key in lifted:
            del text_format["max_chars"]
    return LiftedSpec(json.dumps(document, ensure_ascii=False), lifted,
                      frozenset(_invoke_names(document)))


def _limited_params(node: Any, tool: Optional[str]) -> Iterator[tuple[LimitKey, int, dict]]:
    """(key, limit, the any_text dict) of every liftable parameter tag below `node`."""
    if isinstance(node, list):
        for item in node:
            yield from _limited_params(item, tool)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "sequence":
        tool = _invoke_name(node.get("elements")) or tool
    if node.get("type") == "tag" and tool is not None:
        found = _param_limit(node)
        if found is not None:
            limit, text_format = found
            yield (tool, node["begin"]), limit, text_format
            return
    for value in node.values():
        yield from _limited_params(value, tool)


def _invoke_names(node: Any) -> Iterator[str]:
    children = node if isinstance(node, list) else node.values() if isinstance(node, dict) else ()
    if isinstance(node, dict) and node.get("type") == "sequence":
        name = _invoke_name(node.get("elements"))
        if name is not None:
            yield name
    for child in children:
        yield from _invoke_names(child)


def _invoke_name(elements: Any) -> Optional[str]:
    if not isinstance(elements, list) or not elements or not isinstance(elements[0], dict):
        return None
    first = elements[0]
    if first.get("type") != "const_string" or not isinstance(first.get("value"), str):
        return None
    match = INVOKE_HEAD.match(first["value"])
    return match.group(1) if match else None


def _param_limit(tag: dict) -> Optional[tuple[int, dict]]:
    """(code points allowed in the value, the any_text dict) of a liftable parameter tag."""
    begin = tag.get("begin")
    if tag.get("end") != PARAM_CLOSE or not isinstance(begin, str) \
            or not STRING_PARAM_BEGIN.match(begin):
        return None
    content = tag.get("content")
    prefix_chars: Optional[int] = 0
    if isinstance(content, dict) and content.get("type") == "sequence":
        elements = content.get("elements")
        if not isinstance(elements, list) or len(elements) != 2:
            return None
        prefix_chars, content = _min_length_prefix(elements[0]), elements[1]
    if prefix_chars is None or not isinstance(content, dict) or content.get("type") != "any_text":
        return None
    limit = content.get("max_chars")
    excludes = content.get("excludes")
    if not _is_count(limit) or not isinstance(excludes, list) or DSML not in excludes \
            or content.get("max_tokens") is not None:
        return None
    return prefix_chars + limit, content


def _min_length_prefix(node: Any) -> Optional[int]:
    if not isinstance(node, dict) or node.get("type") != "regex" \
            or not isinstance(node.get("pattern"), str):
        return None
    match = MIN_LENGTH_PREFIX.match(node["pattern"])
    return int(match.group(1)) if match else None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
