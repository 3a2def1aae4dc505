"""DeepSeek-V4 output parsing: the dsml-parse conformance cases, whole and streamed, plus the README's
rules that the visible cases do not reach."""
from __future__ import annotations

import itertools
import random
import json
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from services.frontend import dsv4_tokens as tok
from services.frontend.dsml_parser import (
    ContentDelta, DsmlParseError, ParsedMessage, ReasoningDelta, StreamingParser, ToolCallArguments,
    ToolCallStart, finish_reason, new_tool_call_id, parse_completion)
from services.frontend.tokenizer import Dsv4Tokenizer, bundled_tokenizer_dir

CASES_FILE = Path(__file__).resolve().parents[1] / "data" / "dsml_parse_cases.jsonl"
CASES = [json.loads(line) for line in CASES_FILE.read_text(encoding="utf-8").splitlines() if line]
TAGS = (tok.BOS, tok.EOS, tok.THINK_START, tok.THINK_END, tok.DSML)

WEATHER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"},
                                     "cities": {"type": "array", "items": {"type": "string"}}}}}}]


def counting_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_test{next(counter)}"


def block(*invokes: str) -> str:
    return f"\n\n<{tok.DSML}tool_calls>\n" + "".join(invokes) + f"</{tok.DSML}tool_calls>"


def invoke(name: str, *params: tuple[str, str, str]) -> str:
    body = "".join(f'<{tok.DSML}parameter name="{k}" string="{flag}">{v}</{tok.DSML}parameter>\n'
                   for k, flag, v in params)
    return f'<{tok.DSML}invoke name="{name}">\n{body}</{tok.DSML}invoke>\n'


def as_expected(message: ParsedMessage) -> dict[str, Any]:
    return {"content": message.content, "reasoning_content": message.reasoning_content,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls]}


def error_code(text: str, thinking: bool = False, tools: Any = None) -> str:
    with pytest.raises(DsmlParseError) as caught:
        parse_completion(text, thinking, tools)
    return caught.value.code


@pytest.fixture(scope="module")
def tokenizer() -> Dsv4Tokenizer:
    return Dsv4Tokenizer(bundled_tokenizer_dir())


class StreamResult:
    """What an OpenAI streaming client would rebuild from the deltas."""

    def __init__(self, parser: StreamingParser, pieces: Iterable[str], stopped_on_eos: bool) -> None:
        self.deltas = [d for piece in pieces for d in parser.feed(piece)]
        self.deltas += parser.finish(stopped_on_eos)
        self.outcome = parser.outcome
        self.content = "".join(d.text for d in self.deltas if isinstance(d, ContentDelta))
        self.reasoning = "".join(d.text for d in self.deltas if isinstance(d, ReasoningDelta))
        self.starts = [d for d in self.deltas if isinstance(d, ToolCallStart)]
        self.arguments: dict[int, str] = {}
        for d in self.deltas:
            if isinstance(d, ToolCallArguments):
                self.arguments[d.index] = self.arguments.get(d.index, "") + d.fragment


def stream(case: dict[str, Any], pieces: Iterable[str]) -> StreamResult:
    parser = StreamingParser(case["thinking_mode"] == "thinking", case["tools"], counting_ids())
    return StreamResult(parser, pieces, case["completion_text"].endswith(tok.EOS))


def assert_stream_matches_whole(case: dict[str, Any], result: StreamResult) -> None:
    for delta in result.deltas:
        if isinstance(delta, (ContentDelta, ReasoningDelta)):
            assert not any(tag in delta.text for tag in TAGS), delta
    assert len({s.index for s in result.starts}) == len(result.starts)
    text, thinking = case["completion_text"], case["thinking_mode"] == "thinking"
    try:
        whole = parse_completion(text, thinking, case["tools"], new_call_id=counting_ids())
    except DsmlParseError as error:
        assert result.outcome.error is not None and result.outcome.error.code == error.code
        assert result.outcome.tool_calls == []
        assert result.outcome.incomplete_tool_calls == len(result.starts)
        return
    assert result.outcome.error is None
    assert (result.content, result.reasoning) == (whole.content, whole.reasoning_content)
    assert [(s.index, s.id, s.name) for s in result.starts] == [
        (i, c.id, c.name) for i, c in enumerate(whole.tool_calls)]
    assert [result.arguments[i] for i in range(len(whole.tool_calls))] == [
        c.arguments_json for c in whole.tool_calls]
    assert result.outcome.message == whole


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_conformance_case_parses_to_expected_message(case: dict[str, Any]) -> None:
    thinking = case["thinking_mode"] == "thinking"
    if "error" in case["expected"]:
        code = error_code(case["completion_text"], thinking, case["tools"])
        assert code == case["expected"]["error"]
    else:
        message = parse_completion(case["completion_text"], thinking, case["tools"])
        assert as_expected(message) == case["expected"]
        for call in message.tool_calls:
            assert json.loads(call.arguments_json) == call.arguments


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_streaming_token_by_token_equals_whole_parse(case: dict[str, Any],
                                                     tokenizer: Dsv4Tokenizer) -> None:
    detokenizer = tokenizer.detokenizer()
    pieces = [detokenizer.feed([i]) for i in tokenizer.encode(case["completion_text"])]
    assert "".join(pieces) == case["completion_text"]
    assert_stream_matches_whole(case, stream(case, pieces))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_streaming_char_by_char_and_every_split_equal_whole_parse(case: dict[str, Any]) -> None:
    text = case["completion_text"]
    assert_stream_matches_whole(case, stream(case, list(text)))
    for cut in range(1, len(text)):
        assert_stream_matches_whole(case, stream(case, [text[:cut], text[cut:]]))


def test_block_before_think_end_ends_reasoning_implicitly() -> None:
    text = "Let me look." + block(invoke("get_weather", ("location", "true", "Oslo"))) + tok.EOS
    message = parse_completion(text, True, WEATHER_TOOLS)
    assert (message.reasoning_content, message.content) == ("Let me look.", "")
    assert message.tool_calls[0].arguments == {"location": "Oslo"}


def test_block_after_one_newline_is_not_a_block_and_leaks_no_dsml() -> None:
    text = "Sure.\n" + block(invoke("get_weather"))[2:] + tok.EOS
    assert error_code(text, False, WEATHER_TOOLS) == "special_token_in_text"


@pytest.mark.parametrize("text", [
    f'\n\n<{tok.DSML}tool_calls><{tok.DSML}invoke name="f"></{tok.DSML}invoke></{tok.DSML}tool_calls>'
    + tok.EOS,
    f'\n\n<{tok.DSML}tool_calls>\n  <{tok.DSML}invoke name="f">\n</{tok.DSML}invoke>\n'
    f'</{tok.DSML}tool_calls>' + tok.EOS,
])
def test_newline_free_or_indented_dsml_is_format_error(text: str) -> None:
    assert error_code(text) == "format_error"


def test_zero_parameter_invoke_accepts_one_or_two_newlines() -> None:
    for gap in ("\n", "\n\n"):
        text = (f'\n\n<{tok.DSML}tool_calls>\n<{tok.DSML}invoke name="now">{gap}'
                f'</{tok.DSML}invoke>\n</{tok.DSML}tool_calls>' + tok.EOS)
        assert parse_completion(text, False, []).tool_calls[0].arguments == {}


def test_text_after_block_is_content_after_tool_calls() -> None:
    text = block(invoke("get_weather", ("location", "true", "Rome"))) + "Done!" + tok.EOS
    assert error_code(text, False, WEATHER_TOOLS) == "content_after_tool_calls"


def test_closed_block_without_eos_is_missing_eos_unless_caller_saw_eos() -> None:
    text = block(invoke("get_weather", ("location", "true", "Rome")))
    assert error_code(text, False, WEATHER_TOOLS) == "missing_eos"
    message = parse_completion(text, False, WEATHER_TOOLS, stopped_on_eos=True)
    assert message.tool_calls[0].arguments == {"location": "Rome"}


def test_duplicate_parameter_is_an_error() -> None:
    text = block(invoke("get_weather", ("location", "true", "A"), ("location", "true", "B"))) + tok.EOS
    assert error_code(text, False, WEATHER_TOOLS) == "duplicate_parameter"


def test_reasoning_without_think_end_is_missing_think_end_with_partial_reasoning() -> None:
    with pytest.raises(DsmlParseError) as caught:
        parse_completion("thinking hard" + tok.EOS, True, [])
    assert caught.value.code == "missing_think_end"
    with pytest.raises(DsmlParseError) as caught:
        parse_completion("still thinking", True, [])
    assert caught.value.code == "missing_think_end"
    assert caught.value.partial == ParsedMessage("", "still thinking", [])


def test_plain_content_cut_by_length_is_missing_eos_with_partial_content() -> None:
    with pytest.raises(DsmlParseError) as caught:
        parse_completion("The answer is", False, [])
    assert caught.value.code == "missing_eos"
    assert caught.value.partial == ParsedMessage("The answer is", "", [])


@pytest.mark.parametrize("text", [
    "a <think> b" + tok.EOS, "a </think> b" + tok.EOS, f"a {tok.DSML} b" + tok.EOS,
    tok.BOS + "hi" + tok.EOS,
    f'\n\n<{tok.DSML}function_calls>\n<{tok.DSML}invoke name="f">\n</{tok.DSML}invoke>\n'
    f'</{tok.DSML}function_calls>' + tok.EOS,
])
def test_special_tokens_in_content_are_rejected(text: str) -> None:
    assert error_code(text) == "special_token_in_text"


def test_schema_type_decides_over_the_flag() -> None:
    text = block(invoke("get_weather", ("location", "false", "Paris"), ("days", "true", "3"),
                        ("cities", "true", '["a", "b"]'))) + tok.EOS
    call = parse_completion(text, False, WEATHER_TOOLS).tool_calls[0]
    assert call.arguments == {"location": "Paris", "days": 3, "cities": ["a", "b"]}


def test_flag_decides_for_unknown_tools_and_values_are_verbatim() -> None:
    text = block(invoke("other", ("n", "true", "42"), ("m", "false", " 42 "),
                        ("s", "true", " a<b>&\"c\n<"))) + tok.EOS
    call = parse_completion(text, False, WEATHER_TOOLS).tool_calls[0]
    assert call.arguments == {"n": "42", "m": 42, "s": ' a<b>&"c\n<'}


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999", "{bad", ""])
def test_non_json_values_are_invalid_json_value(value: str) -> None:
    text = block(invoke("get_weather", ("days", "false", value))) + tok.EOS
    assert error_code(text, False, WEATHER_TOOLS) == "invalid_json_value"


def test_truncated_stream_presents_no_completed_call() -> None:
    text = block(invoke("get_weather", ("location", "true", "Madrid")))[:-10]
    parser = StreamingParser(False, WEATHER_TOOLS, counting_ids())
    result = StreamResult(parser, [text], stopped_on_eos=False)
    assert [s.name for s in result.starts] == ["get_weather"]
    assert result.outcome.error is not None
    assert result.outcome.error.code == "truncated_tool_calls"
    assert result.outcome.tool_calls == [] and result.outcome.incomplete_tool_calls == 1
    assert finish_reason("length", len(result.outcome.tool_calls)) == "length"


def test_content_holds_back_a_possible_block_start() -> None:
    parser = StreamingParser(False, WEATHER_TOOLS)
    assert parser.feed("Checking.\n") == [ContentDelta("Checking.")]
    assert parser.feed("\n<") == []
    assert parser.feed(f"{tok.DSML}tool_c") == []
    # Not a block after all: the text before the stray ｜DSML｜ is content, the tag never is.
    assert parser.feed("ool") == [ContentDelta("\n\n<")]
    assert parser.finish(stopped_on_eos=True) == []
    assert parser.outcome.error is not None and parser.outcome.error.code == "special_token_in_text"


def test_think_end_split_across_deltas_never_leaks() -> None:
    parser = StreamingParser(True, [])
    deltas = parser.feed("reason</thi") + parser.feed("nk>answer") + parser.finish(True)
    assert deltas == [ReasoningDelta("reason"), ContentDelta("answer")]


def test_finish_reason_rules() -> None:
    assert finish_reason("stop", 2) == "tool_calls"
    assert finish_reason("stop", 0) == "stop"
    assert finish_reason("length", 1) == "length"


def test_tool_call_ids_have_the_openai_shape_and_differ() -> None:
    ids = {new_tool_call_id() for _ in range(50)}
    assert len(ids) == 50
    for call_id in ids:
        assert call_id.startswith("call_") and len(call_id) == 29 and call_id[5:].isalnum()


MUTATIONS = ["\n", "\n\n", "<", ">", '"', tok.EOS, tok.THINK_END, tok.DSML, "x", "{",
             f"</{tok.DSML}parameter>", ' string="false">']


def test_mutated_completions_stream_exactly_like_the_whole_parse() -> None:
    """Malformed outputs too: random edits of the cases, streamed in random pieces, must give the
    same message or the same error as the whole parse, and never leak a tag."""
    rng = random.Random(20261129)
    for _ in range(400):
        case = dict(rng.choice(CASES))
        text = case["completion_text"]
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text) + 1)
            if rng.random() < 0.5:
                text = text[:at] + rng.choice(MUTATIONS) + text[at:]
            else:
                text = text[:at] + text[at + rng.randint(1, 5):]
        case["completion_text"] = text
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert_stream_matches_whole(case, stream(case, pieces))
