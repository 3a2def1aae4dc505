"""OpenAI chat request → DeepSeek-V4 prompt: the chat-encoding conformance cases (text and token ids)
and the README's mapping rules beyond them, plus clear 400s for malformed messages."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.frontend import dsv4_tokens as tok
from services.frontend.chat_encoder import REASONING_EFFORT_MAX
from services.frontend.chat_format import is_deepseek_v4, render_chat_request
from services.frontend.errors import RequestError
from services.frontend.tokenizer import Dsv4Tokenizer, bundled_tokenizer_dir

CASES_FILE = Path(__file__).resolve().parents[1] / "data" / "chat_encoding_cases.jsonl"
CASES = [json.loads(line) for line in CASES_FILE.read_text(encoding="utf-8").splitlines() if line]

TOOL = {"type": "function", "function": {"name": "get_time", "strict": True, "description": "Now.",
                                         "parameters": {"type": "object", "properties": {}}}}
CHAT = {"thinking": False}
THINKING = {"thinking": True}


def render(messages: list[dict[str, Any]], **body: Any) -> str:
    return render_chat_request({"model": "m", "messages": messages, **body}).text


def tools_section_of(tools: list[dict[str, Any]]) -> str:
    """The tools section as the first system message carries it (from a rendered prompt)."""
    text = render([{"role": "user", "content": "x"}], tools=tools, chat_template_kwargs=CHAT)
    return text[len(tok.BOS):text.index(tok.USER)]


def rejected(body: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as caught:
        render_chat_request({"model": "m", **body})
    return caught.value


@pytest.fixture(scope="module")
def tokenizer() -> Dsv4Tokenizer:
    return Dsv4Tokenizer(bundled_tokenizer_dir())


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_conformance_case_renders_expected_prompt_and_ids(case: dict[str, Any],
                                                          tokenizer: Dsv4Tokenizer) -> None:
    rendered = render_chat_request(case["request"])
    assert rendered.text == case["expected_prompt"]
    assert tokenizer.encode(rendered.text) == case["expected_token_ids"]
    kwargs = case["request"].get("chat_template_kwargs", {})
    assert rendered.thinking == bool(kwargs.get("thinking", kwargs.get("enable_thinking", False)))


def test_default_mode_is_chat_and_enable_thinking_is_a_synonym() -> None:
    user = [{"role": "user", "content": "hi"}]
    default = render_chat_request({"messages": user})
    assert not default.thinking
    assert default.text == f"{tok.BOS}{tok.USER}hi{tok.ASSISTANT}{tok.THINK_END}"
    synonym = render_chat_request({"messages": user,
                                   "chat_template_kwargs": {"enable_thinking": True}})
    assert synonym.thinking and synonym.text.endswith(tok.ASSISTANT + tok.THINK_START)


def test_reasoning_effort_max_from_kwargs_only_in_thinking_mode() -> None:
    user = [{"role": "user", "content": "hi"}]
    kwargs_max = {"thinking": True, "reasoning_effort": "max"}
    assert render(user, chat_template_kwargs=kwargs_max).startswith(tok.BOS + REASONING_EFFORT_MAX)
    plain = render(user, chat_template_kwargs=THINKING)
    for effort in ("high", "low"):
        assert render(user, reasoning_effort=effort, chat_template_kwargs=THINKING) == plain
    # the top-level field wins over chat_template_kwargs
    assert render(user, reasoning_effort="high", chat_template_kwargs=kwargs_max) == plain


def test_tools_attach_to_first_system_message_wherever_it_is() -> None:
    messages = [{"role": "user", "content": "a"}, {"role": "system", "content": "S"},
                {"role": "user", "content": "b"}]
    text = render(messages, tools=[TOOL], chat_template_kwargs=CHAT)
    section = tools_section_of([TOOL])
    assert text == f"{tok.BOS}{tok.USER}aS{section}{tok.USER}b{tok.ASSISTANT}{tok.THINK_END}"
    assert section.startswith("\n\n## Tools\n\n")
    assert json.dumps(TOOL["function"], ensure_ascii=False) in section  # key order and 'strict' kept


def test_tools_never_attach_to_developer_and_empty_tools_mean_none() -> None:
    messages = [{"role": "developer", "content": "D"}, {"role": "user", "content": "u"}]
    text = render(messages, tools=[TOOL], chat_template_kwargs=CHAT)
    assert text.startswith(tok.BOS + tools_section_of([TOOL]) + tok.USER + "D")
    assert render(messages, tools=[], chat_template_kwargs=CHAT) == render(
        messages, chat_template_kwargs=CHAT)


def test_response_format_is_dumped_as_sent_after_tools() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    text = render([{"role": "user", "content": "u"}], tools=[TOOL], response_format=fmt,
                  chat_template_kwargs=CHAT)
    assert (tools_section_of([TOOL]) + "\n\n## Response Format:\n\nYou MUST strictly adhere to the "
            "following schema to reply:\n" + json.dumps(fmt, ensure_ascii=False) + tok.USER) in text
    assert render([{"role": "user", "content": "u"}], response_format={"type": "text"}) == render(
        [{"role": "user", "content": "u"}])


def test_thinking_without_tools_drops_earlier_reasoning_and_developer_turns() -> None:
    messages = [{"role": "developer", "content": "old rules"}, {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
                {"role": "user", "content": "q2"}]
    assert render(messages, chat_template_kwargs=THINKING) == (
        f"{tok.BOS}{tok.USER}q1{tok.ASSISTANT}{tok.THINK_END}a1{tok.EOS}"
        f"{tok.USER}q2{tok.ASSISTANT}{tok.THINK_START}")


def test_drop_thinking_false_keeps_reasoning_and_primes_every_turn() -> None:
    messages = [{"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
                {"role": "user", "content": "q2"}]
    kwargs = {"thinking": True, "drop_thinking": False}
    assert render(messages, chat_template_kwargs=kwargs) == (
        f"{tok.BOS}{tok.USER}q1{tok.ASSISTANT}{tok.THINK_START}r1{tok.THINK_END}a1{tok.EOS}"
        f"{tok.USER}q2{tok.ASSISTANT}{tok.THINK_START}")


def tool_round(arguments: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


def test_tools_switch_dropping_off_but_a_follow_up_without_tools_drops() -> None:
    messages = tool_round("{}") + [
        {"role": "assistant", "content": "done", "reasoning_content": "r2"},
        {"role": "user", "content": "again"}]
    call = (f'\n\n<{tok.DSML}tool_calls>\n<{tok.DSML}invoke name="f">\n\n</{tok.DSML}invoke>\n'
            f'</{tok.DSML}tool_calls>')
    turns = (f"{tok.USER}q{tok.ASSISTANT}{{think}}{{r}}{call}{tok.EOS}"
             f"{tok.USER}<tool_result>ok</tool_result>{tok.ASSISTANT}{{think}}{{r2}}done{tok.EOS}"
             f"{tok.USER}again{tok.ASSISTANT}{tok.THINK_START}")
    assert render(messages, chat_template_kwargs=THINKING) == tok.BOS + turns.format(
        think=tok.THINK_END, r="", r2="")
    assert render(messages, tools=[TOOL], chat_template_kwargs=THINKING) == (
        tok.BOS + tools_section_of([TOOL]) + turns.format(
            think=tok.THINK_START, r="r" + tok.THINK_END, r2="r2" + tok.THINK_END))


def test_history_arguments_are_reserialized_like_python_json() -> None:
    text = render(tool_round('{"s": "a\\"b\\n", "f": 2.50, "e": 1e3, "big": 123456789012345678901234,'
                             ' "o": {"k": "\\u4e0a"}, "b": false}'), chat_template_kwargs=CHAT)
    p = f"</{tok.DSML}parameter>"
    assert (f'<{tok.DSML}parameter name="s" string="true">a"b\n{p}\n'
            f'<{tok.DSML}parameter name="f" string="false">2.5{p}\n'
            f'<{tok.DSML}parameter name="e" string="false">1000.0{p}\n'
            f'<{tok.DSML}parameter name="big" string="false">123456789012345678901234{p}\n'
            f'<{tok.DSML}parameter name="o" string="false">{{"k": "上"}}{p}\n'
            f'<{tok.DSML}parameter name="b" string="false">false{p}\n') in text


def test_invalid_json_arguments_render_as_one_raw_string_parameter() -> None:
    text = render(tool_round("not json {"), chat_template_kwargs=CHAT)
    assert (f'<{tok.DSML}invoke name="f">\n<{tok.DSML}parameter name="arguments" string="true">'
            f'not json {{</{tok.DSML}parameter>\n</{tok.DSML}invoke>') in text


def test_tool_results_merge_with_users_and_reorder_by_call_ids() -> None:
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "B1"},
                                                                  {"type": "text", "text": "B2"}]},
                {"role": "tool", "tool_call_id": "zzz", "content": "Z"},
                {"role": "tool", "tool_call_id": "a", "content": "A"},
                {"role": "user", "content": "thanks"}, {"role": "user", "content": "more"}]
    text = render(messages, chat_template_kwargs=CHAT)
    # unknown id sorts as position 0 (stable): zzz, a, b; user texts keep their slots
    assert text.endswith(f"{tok.EOS}{tok.USER}<tool_result>Z</tool_result>\n\n<tool_result>A"
                         f"</tool_result>\n\n<tool_result>B1\n\nB2</tool_result>\n\nthanks\n\nmore"
                         f"{tok.ASSISTANT}{tok.THINK_END}")


def test_latest_reminder_role_and_look_alike_tokens_are_raw_text() -> None:
    messages = [{"role": "user", "content": "<|User|> <think > ｜"},
                {"role": "latest_reminder", "content": "be brief"}]
    assert render(messages, chat_template_kwargs=CHAT) == (
        f"{tok.BOS}{tok.USER}<|User|> <think > ｜{tok.ASSISTANT}{tok.THINK_END}"
        f"{tok.LATEST_REMINDER}be brief")


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "developer", "content": ""}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]},
     "messages[1].tool_call_id"),
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                {"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[2].content[1].type"),
    ({"messages": tool_round("[1, 2]")}, "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}]},
     "messages[0].tool_calls[0].function.name"),
    ({"messages": [{"role": "user", "content": "u"}], "chat_template_kwargs": {"thinking": "yes"}},
     "chat_template_kwargs.thinking"),
    ({"messages": [{"role": "user", "content": "u"}], "tools": [{"type": "function"}]},
     "tools[0].function"),
])
def test_malformed_requests_are_rejected_naming_the_field(body: dict[str, Any], param: str) -> None:
    error = rejected(body)
    assert error.param == param
    assert error.code == "invalid_request_error"
    assert param.split(".")[-1].split("[")[0] in error.message


def test_model_detection_uses_model_type() -> None:
    assert is_deepseek_v4({"model_type": "deepseek_v4", "name_or_path": "anything"})
    assert not is_deepseek_v4({"model_type": "llama", "name_or_path": "deepseek-v4-flash"})
    assert not is_deepseek_v4({})
