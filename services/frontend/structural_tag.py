"""Building blocks of the XGrammar 0.2.7 structural tag for DeepSeek-V4 DSML tool calls.

Each function returns one structural-tag format (a JSON-ready dict). The block they spell, byte-exact
with the chat format:

    "\\n\\n<｜DSML｜tool_calls>\\n"
    <｜DSML｜invoke name="NAME">\\n
    <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\\n   (one per argument)
    </｜DSML｜invoke>\\n                                                 (more invokes if parallel)
    </｜DSML｜tool_calls>                                                then EOS

A call with no arguments renders as `<｜DSML｜invoke name="f">\\n\\n</｜DSML｜invoke>` (a blank
line), as in the chat format.

Structural tags have no named rules, so a sub-format used twice is written out twice, and XGrammar
refuses formats nested deeper than 100 levels (measured). `at_least_one` keeps both in check.
"""
from __future__ import annotations

import json
from typing import Any

from services.frontend.schema_openness import with_explicit_openness

Format = dict[str, Any]

DSML = "｜DSML｜"
BLOCK_OPEN = f"\n\n<{DSML}tool_calls>\n"
# The auto-mode trigger stops at the DSML token: XGrammar 0.2.7 lets free text continue after a
# partial match of a longer trigger without applying the excludes (measured: "\n\n<｜DSML｜<" was
# accepted as text), while with this trigger `｜DSML｜` after "\n\n<" can only open the block.
BLOCK_TRIGGER = f"\n\n<{DSML}"
BLOCK_CLOSE = f"</{DSML}tool_calls>"
INVOKE_CLOSE = f"</{DSML}invoke>\n"
PARAM_CLOSE = f"</{DSML}parameter>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Free text (reasoning, or content before an auto call) never contains think tags or DSML markup,
# so the parser can never mistake it for a block.
FREE_TEXT_EXCLUDES = [THINK_OPEN, THINK_CLOSE, DSML]
# DSML markup and think tags never belong inside a raw string argument either. Excluding them also
# means a `｜DSML｜` after `</` can only start the closing tag, so the grammar forces the rest of it.
# (`</｜DSML｜` is listed on its own: XGrammar 0.2.7 lets `｜DSML｜` through right after `</`
# inside a tag whose end starts that way, measured.)
RAW_STRING_EXCLUDES = [*FREE_TEXT_EXCLUDES, f"</{DSML}"]
JSON_MAX_WHITESPACE = 1


def structural_tag_json(fmt: Format) -> str:
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


def encoded_size(fmt: Format) -> int:
    """The UTF-8 size of `fmt` as JSON, without writing it out.

    Sub-formats are shared Python objects (a parameter appears in several branches), so sizes are
    memoized by identity: the cost is linear in the distinct objects, not in the written text.
    """
    memo: dict[int, int] = {}

    def size(value: Any) -> int:
        if not isinstance(value, (dict, list)):
            return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
        if id(value) not in memo:
            items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
            parts = [size(v) + (size(k) + 2 if k is not None else 0) for k, v in items]
            memo[id(value)] = 2 + sum(parts) + 2 * max(len(parts) - 1, 0)
        return memo[id(value)]

    return size({"type": "structural_tag", "format": fmt})


def const(value: str) -> Format:
    return {"type": "const_string", "value": value}


def sequence(elements: list[Format]) -> Format:
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}


def one_of(elements: list[Format]) -> Format:
    return elements[0] if len(elements) == 1 else {"type": "or", "elements": elements}


def optional(content: Format) -> Format:
    return {"type": "optional", "content": content}


def json_value(schema: Any) -> Format:
    """A JSON value matching `schema`, whose implicit openness is spelled out (XGrammar is strict)."""
    return {"type": "json_schema", "json_schema": with_explicit_openness(schema), "style": "json",
            "max_whitespace_cnt": JSON_MAX_WHITESPACE}


def with_reasoning(fmt: Format, thinking: bool) -> Format:
    """In thinking mode the output opens with a reasoning span closed by `</think>`."""
    if not thinking:
        return fmt
    reasoning = {"type": "tag", "begin": "",
                 "content": {"type": "any_text", "excludes": FREE_TEXT_EXCLUDES},
                 "end": THINK_CLOSE}
    return {"type": "sequence", "elements": [reasoning, fmt]}


def calls(invokes: list[Format], parallel: bool) -> Format:
    one_call = one_of(invokes)
    return {"type": "plus", "content": one_call} if parallel else one_call


def block(invokes: list[Format], parallel: bool) -> Format:
    return sequence([const(BLOCK_OPEN), calls(invokes, parallel), const(BLOCK_CLOSE)])


def auto_block(invokes: list[Format], parallel: bool) -> Format:
    """Free text, optionally ending with one tool-call block (then nothing but EOS)."""
    block_tag = {"type": "tag", "begin": BLOCK_OPEN, "content": calls(invokes, parallel),
                 "end": BLOCK_CLOSE}
    return {"type": "triggered_tags", "triggers": [BLOCK_TRIGGER], "tags": [block_tag],
            "excludes": FREE_TEXT_EXCLUDES, "at_least_one": False, "stop_after_first": True}


def invoke(name: str, params: list[tuple[Format, bool]]) -> Format:
    """One call of tool `name`; `params`: (parameter format, required) in schema order."""
    return sequence([const(f'<{DSML}invoke name="{name}">\n'), argument_list(params),
                     const(INVOKE_CLOSE)])


def argument_list(params: list[tuple[Format, bool]]) -> Format:
    """Parameters in schema order, required ones present, optional ones optional.

    Each emitted parameter ends with a newline; when none is emitted the invoke has a blank line,
    so a tool without required parameters needs "at least one of its parameters" or that line.
    """
    if not params:
        return const("\n")
    if any(required for _, required in params):
        return sequence([fmt if required else optional(fmt) for fmt, required in params])
    return one_of([at_least_one([fmt for fmt, _ in params]), const("\n")])


def at_least_one(formats: list[Format]) -> Format:
    """A non-empty in-order selection of `formats`, each at most once.

    Split in halves: one or more from the first half then any of the second, or one or more from
    the second half alone. Every format is written out about 1 + log2(n)/2 times and the nesting
    grows by two levels per halving. (Spelling out "the first one present is i" per i, as before,
    wrote n²/2 formats: 500 optional integers were a 40 MB tag, 5,000 would be 4 GB.)
    """
    if len(formats) == 1:
        return formats[0]
    half = len(formats) // 2
    head, tail = formats[:half], formats[half:]
    return one_of([sequence([at_least_one(head), *(optional(fmt) for fmt in tail)]),
                   at_least_one(tail)])
