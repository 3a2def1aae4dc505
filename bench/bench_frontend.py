"""Frontend library throughput: prompt rendering + tokenization of a long chat, and the streaming DSML
parser on long tool-call outputs.

    python -m bench.bench_frontend [--turns 40] [--calls 20] [--seconds 2]

Prints one line per figure. CPU only; run from the repository root.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

from services.frontend import dsv4_tokens as tok
from services.frontend.chat_format import render_chat_request
from services.frontend.dsml_parser import StreamingParser
from services.frontend.tokenizer import Dsv4Tokenizer, bundled_tokenizer_dir

TOOLS = [{"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                                     "mode": {"type": "integer"}, "tags": {"type": "array"}}}}}]


def long_chat(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful engineer."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Step {i}: refactor module {i} — keep the API.\n"
                                                    + "    def f(x):\n        return x * 2\n" * 8})
        arguments = json.dumps({"path": f"src/m{i}.py", "content": "print('hi')\n" * 10, "mode": 420})
        messages.append({"role": "assistant", "content": "", "reasoning_content": "Plan " * 40,
                         "tool_calls": [{"id": f"c{i}", "type": "function",
                                         "function": {"name": "write_file", "arguments": arguments}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "written 120 bytes"})
    messages.append({"role": "user", "content": "Summarize what changed."})
    return {"messages": messages, "tools": TOOLS, "chat_template_kwargs": {"thinking": True}}


def tool_call_output(calls: int) -> str:
    body = "line of generated code with \"quotes\" and <tags> & ünïcödé\n" * 40
    invoke = (f'<{tok.DSML}invoke name="write_file">\n'
              f'<{tok.DSML}parameter name="path" string="true">src/generated.py</{tok.DSML}parameter>\n'
              f'<{tok.DSML}parameter name="content" string="true">{body}</{tok.DSML}parameter>\n'
              f'<{tok.DSML}parameter name="mode" string="false">420</{tok.DSML}parameter>\n'
              f'<{tok.DSML}parameter name="tags" string="false">["a", "b", {{"k": 1}}]'
              f'</{tok.DSML}parameter>\n</{tok.DSML}invoke>\n')
    return ("I will write the files now.</think>Writing." + f"\n\n<{tok.DSML}tool_calls>\n"
            + invoke * calls + f"</{tok.DSML}tool_calls>" + tok.EOS)


def repeat_for(seconds: float, action: Callable[[], Any]) -> tuple[int, float]:
    count, start = 0, time.perf_counter()
    while True:
        action()
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return count, elapsed


def bench_render_tokenize(tokenizer: Dsv4Tokenizer, turns: int, seconds: float) -> None:
    body = long_chat(turns)
    prompt = render_chat_request(body).text
    n_tokens = len(tokenizer.encode(prompt))
    count, elapsed = repeat_for(seconds, lambda: render_chat_request(body))
    print(f"render      : {count / elapsed:9.1f} prompts/s  ({len(prompt)} chars, {turns} turns)")
    count, elapsed = repeat_for(seconds, lambda: tokenizer.encode(render_chat_request(body).text))
    print(f"render+encode: {count / elapsed:8.1f} prompts/s  "
          f"{count * n_tokens / elapsed:12.0f} tokens/s  ({n_tokens} tokens)")


def bench_streaming_parser(tokenizer: Dsv4Tokenizer, calls: int, seconds: float) -> None:
    text = tool_call_output(calls)
    detokenizer = tokenizer.detokenizer()
    pieces = [detokenizer.feed([i]) for i in tokenizer.encode(text)]

    def parse_stream() -> int:
        parser = StreamingParser(True, TOOLS)
        n = sum(len(parser.feed(piece)) for piece in pieces) + len(parser.finish(True))
        assert parser.outcome.error is None and len(parser.outcome.tool_calls) == calls
        return n

    deltas = parse_stream()
    count, elapsed = repeat_for(seconds, parse_stream)
    print(f"stream parse: {count * len(text) / elapsed:12.0f} chars/s  "
          f"{count * deltas / elapsed:10.0f} deltas/s  {count * len(pieces) / elapsed:10.0f} tokens/s"
          f"  ({len(text)} chars, {len(pieces)} token deltas, {calls} calls)")

    def parse_whole() -> None:
        parser = StreamingParser(True, TOOLS)
        parser.feed(text)
        parser.finish(True)

    count, elapsed = repeat_for(seconds, parse_whole)
    print(f"whole parse : {count * len(text) / elapsed:12.0f} chars/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    start = time.perf_counter()
    tokenizer = Dsv4Tokenizer(bundled_tokenizer_dir())
    print(f"tokenizer load: {time.perf_counter() - start:.2f} s")
    bench_render_tokenize(tokenizer, args.turns, args.seconds)
    bench_streaming_parser(tokenizer, args.calls, args.seconds)


if __name__ == "__main__":
    main()
