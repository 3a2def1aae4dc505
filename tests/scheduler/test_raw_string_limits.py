"""Raw-string `maxLength` lifted out of the grammar and enforced by the scheduler's length guard
accepts exactly what XGrammar's own `max_chars` accepts: token by token and mask by mask, on random
values (multi-byte UTF-8, `<`-prefixed tails of the closing tag, the excluded marker) under random
tokenizations of the real tokenizer (characters split into byte tokens included); and it rolls back
with the matcher.

XGrammar 0.2.7's token-level rule is copied on purpose: a token that starts with a continuation
byte needs one character left, so `é` split as `\xc3` + `\xa9` cannot be completed once `\xc3`
took the last character (its verdict on the same text as one string differs there)."""
from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import numpy as np
import pytest
import xgrammar as xgr

from services.frontend.constraints import build_constraint
from services.scheduler.grammar import GrammarService
from services.scheduler.grammar_matcher import RequestMatcher
from services.scheduler.raw_string_guard import MAX_ROLLBACK_TOKENS
from services.scheduler.raw_string_lift import lift_raw_string_limits


VOCAB_SIZE = 129280
EOS = 1
DSML = "｜DSML｜"
NOTE = {"type": "function", "function": {"name": "note", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["title", "body"],
    "properties": {"title": {"type": "string", "maxLength": 3},
                   "body": {"type": "string", "minLength": 1, "maxLength": 4},
                   "tag": {"type": "string"}}}}}
# Pieces of values: multi-byte UTF-8 (2, 3, 4 bytes), `<`-prefixed tails of the closing tag, and
# the excluded marker itself.
PIECES = ["a", "b", " ", "é", "中", "😀", "<", "/", "</", "</｜", f"</{DSML[:3]}", "｜", "DSML",
          "<｜", ">", "\n"]


def call(title: str, body: str, tag: str = "") -> str:
    params = [("title", title), ("body", body)] + ([("tag", tag)] if tag else [])
    text = "".join(f'<{DSML}parameter name="{name}" string="true">{value}</{DSML}parameter>\n'
                   for name, value in params)
    return (f'\n\n<{DSML}tool_calls>\n<{DSML}invoke name="note">\n{text}</{DSML}invoke>\n'
            f"</{DSML}tool_calls>")


@pytest.fixture(scope="module")
def grammars(service: GrammarService) -> tuple[Any, Any]:
    """(the lifted CompiledConstraint, XGrammar's own compile of the unlifted structural tag)."""
    constraint = build_constraint({"tools": [NOTE], "tool_choice": "required"}, thinking=False)
    lifted = asyncio.run(service.compile(constraint.type, constraint.spec))
    info = lifted.grammar.tokenizer_info
    original = xgr.GrammarCompiler(info, cache_enabled=False).compile_structural_tag(constraint.spec)
    return lifted, original


@pytest.fixture(scope="module")
def byte_tokens(grammars) -> dict[int, int]:
    """byte value → the id of the token that is that single byte."""
    vocab = grammars[0].grammar.tokenizer_info.decoded_vocab
    return {bytes(text)[0]: token for token, text in enumerate(vocab) if len(bytes(text)) == 1}


def random_value(rng: random.Random) -> str:
    """0-3 pieces; one value in 20 also holds the excluded marker."""
    value = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 3)))
    return value + DSML if rng.random() < 0.05 else value


def tokenize(service: GrammarService, text: str, rng: random.Random,
             byte_tokens: dict[int, int]) -> list[int]:
    """One of many tokenizations of `text`: random chunks through the real tokenizer, some
    multi-byte characters spelled as single-byte tokens (so they split across tokens)."""
    ids: list[int] = []
    chunk = ""
    for char in text:
        if len(char.encode()) > 1 and rng.random() < 0.3:
            ids += service._tokenizer.encode(chunk, add_special_tokens=False).ids if chunk else []
            ids += [byte_tokens[byte] for byte in char.encode()]
            chunk = ""
            continue
        chunk += char
        if rng.random() < 0.2:
            ids += service._tokenizer.encode(chunk, add_special_tokens=False).ids
            chunk = ""
    ids += service._tokenizer.encode(chunk, add_special_tokens=False).ids if chunk else []
    return ids + [EOS]


def reference_mask(matcher: Any) -> np.ndarray:
    bitmask = xgr.allocate_token_bitmask(1, VOCAB_SIZE)
    matcher.fill_next_token_bitmask(bitmask)
    return bitmask.numpy().view(np.uint32)[0].copy()


def guarded_mask(matcher: RequestMatcher) -> np.ndarray:
    matcher.mask()
    return matcher._words().copy()


def test_liftable_limits_leave_the_compiled_tag(grammars) -> None:
    lifted, _ = grammars
    assert "max_chars" not in lifted.lifted.spec
    assert sorted(lifted.lifted.max_chars.values()) == [3, 4]   # body: minLength 1 + max_chars 3


def test_lifted_grammar_accepts_exactly_what_max_chars_accepts(service, grammars, byte_tokens):
    lifted, original = grammars
    rng = random.Random(13)
    accepted = refused = 0
    for _ in range(500):
        text = call(random_value(rng), random_value(rng), random_value(rng))
        tokens = tokenize(service, text, rng, byte_tokens)
        reference, guarded = xgr.GrammarMatcher(original), service.matcher(lifted)
        for index, token in enumerate(tokens):
            expected = reference.accept_token(token)
            assert guarded.accept(token) == expected, (text, tokens[:index + 1])
            if not expected:
                break
        valid = reference.is_terminated()
        assert guarded.is_terminated() == valid, text
        accepted += valid
        refused += not valid
        guarded.release()
    assert accepted > 50 and refused > 50     # both outcomes are well represented


def test_lifted_masks_equal_max_chars_masks_along_values(service, grammars, byte_tokens):
    lifted, original = grammars
    rng = random.Random(5)
    for title, body in (("a中", "😀<b"), ("é<", "</x"), ("", "a" * 4), ("<｜", "中中中<"),
                        ("ab中", "é<</"), ("aé", "b😀")):
        tokens = tokenize(service, call(title, body), rng, byte_tokens)
        reference, guarded = xgr.GrammarMatcher(original), service.matcher(lifted)
        for token in tokens:
            assert np.array_equal(guarded_mask(guarded), reference_mask(reference))
            if not reference.accept_token(token):
                break
            assert guarded.accept(token)
        guarded.release()


def test_rollback_returns_guard_and_matcher_to_an_earlier_token(service, grammars, byte_tokens):
    lifted, original = grammars
    rng = random.Random(7)
    for _ in range(20):
        tokens = tokenize(service, call("ab", "中<c"), rng, byte_tokens)
        end = rng.randint(1, len(tokens) - 1)
        back = rng.randint(0, end)
        guarded, reference = service.matcher(lifted), xgr.GrammarMatcher(original)
        assert all(guarded.accept(token) for token in tokens[:end])
        guarded.rollback(back)
        assert all(reference.accept_token(token) for token in tokens[:end - back])
        assert np.array_equal(guarded_mask(guarded), reference_mask(reference))
        assert all(guarded.accept(token) for token in tokens[end - back:])
        assert guarded.is_terminated()
        guarded.release()


def test_a_tool_with_two_limits_for_one_parameter_keeps_max_chars() -> None:
    spec = json.dumps({"type": "structural_tag", "format": {"type": "sequence", "elements": [
        _invoke("t", 3), _invoke("t", 4)]}})
    assert lift_raw_string_limits(spec).spec == spec


def _invoke(tool: str, limit: int) -> dict[str, Any]:
    param = {"type": "tag", "begin": f'<{DSML}parameter name="p" string="true">',
             "end": f"</{DSML}parameter>",
             "content": {"type": "any_text", "excludes": [DSML], "max_chars": limit}}
    return {"type": "sequence", "elements": [
        {"type": "const_string", "value": f'<{DSML}invoke name="{tool}">\n'}, param]}


def test_rollback_past_the_guard_history_is_refused_and_changes_nothing(service, grammars):
    lifted, _ = grammars
    head = (f'\n\n<{DSML}tool_calls>\n<{DSML}invoke name="note">\n'
            f'<{DSML}parameter name="title" string="true">a</{DSML}parameter>\n'
            f'<{DSML}parameter name="body" string="true">b</{DSML}parameter>\n'
            f'<{DSML}parameter name="tag" string="true">')
    word = service._tokenizer.encode("a", add_special_tokens=False).ids
    tokens = service._tokenizer.encode(head, add_special_tokens=False).ids
    guarded = service.matcher(lifted)
    assert all(guarded.accept(token) for token in tokens + word * MAX_ROLLBACK_TOKENS)
    with pytest.raises(ValueError):
        guarded.rollback(MAX_ROLLBACK_TOKENS + 1)
    guarded.rollback(MAX_ROLLBACK_TOKENS)            # back to the value's start: still open
    tail = service._tokenizer.encode(f"x</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}tool_calls>",
                                     add_special_tokens=False).ids
    assert all(guarded.accept(token) for token in tail + [EOS]) and guarded.is_terminated()
    guarded.release()
