"""OpenAI responses of one admitted generation: JSON bodies, SSE chunk streams, their builders.

`AdmittedGeneration` turns the scheduler's token stream into the client's answer: detokenize, cut at
stop strings (a match cancels the call, so the scheduler aborts the request), parse reasoning and
DSML tool calls, then build the body or the chunks. The chunk builders keep the per-response
constants (id, model, created) in one place so every chunk of one stream agrees.

Policy when the DSML parse fails (output that is not a well-formed V4 message, e.g. cut by
max_tokens inside a call): only what was parsed before the problem is returned, no tool call is
presented, and `finish_reason` stays what the scheduler reported (`length` or `stop`). `tool_calls`
is reported only for calls completed before EOS.
"""
from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from services.frontend.dsml_parser import DsmlParseError, StreamingParser, parse_completion
from services.frontend.dsml_types import (ContentDelta, Delta, ReasoningDelta, ToolCallArguments,
                                          ToolCallStart)
from services.frontend.metrics import FrontendMetrics, RequestTimer
from services.frontend.scheduler_client import (Admission, Finish, FinishReason, GenerationStream,
                                                RequestTimedOut, SchedulerError, TokenBatch)
from services.frontend.stop_strings import StoppingDecoder

log = logging.getLogger(__name__)

SSE_DONE = b"data: [DONE]\n\n"


def new_response_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def error_body(message: str, error_type: str, param: Optional[str], code: Optional[str]) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def tool_call_body(call_id: str, name: str, arguments_json: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_json}}


@dataclass(frozen=True)
class ResponseHeader:
    """The constants every body/chunk of one response repeats."""

    response_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))


def chat_completion_body(header: ResponseHeader, message: dict[str, Any], finish_reason: str,
                         usage: dict[str, int]) -> dict[str, Any]:
    return {"id": header.response_id, "object": "chat.completion", "created": header.created,
            "model": header.model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish_reason}],
            "usage": usage}


def chat_message(content: str, reasoning: str, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """An assistant message; empty content next to tool calls is `null`, as OpenAI sends it."""
    message: dict[str, Any] = {"role": "assistant",
                               "content": None if (tool_calls and not content) else content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def text_completion_body(header: ResponseHeader, text: str, finish_reason: str,
                         usage: dict[str, int]) -> dict[str, Any]:
    return {"id": header.response_id, "object": "text_completion", "created": header.created,
            "model": header.model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
            "usage": usage}


class _StreamChunks:
    """Chunks of one stream: every chunk carries the response header, and `usage: null` when the
    client asked for a final usage chunk."""

    object_name = ""

    def __init__(self, header: ResponseHeader, include_usage: bool) -> None:
        self._header = header
        self._include_usage = include_usage

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        chunk = self._chunk([])
        chunk["usage"] = usage_body(prompt_tokens, completion_tokens)
        return chunk

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk = {"id": self._header.response_id, "object": self.object_name,
                 "created": self._header.created, "model": self._header.model, "choices": choices}
        if self._include_usage:
            chunk["usage"] = None
        return chunk


class ChatChunks(_StreamChunks):
    """`chat.completion.chunk` objects of one stream."""

    object_name = "chat.completion.chunk"

    def delta(self, delta: dict[str, Any], finish_reason: Optional[str] = None) -> dict[str, Any]:
        return self._chunk([{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish_reason}])


class TextChunks(_StreamChunks):
    """`text_completion` chunks of one /v1/completions stream."""

    object_name = "text_completion"

    def text(self, text: str, finish_reason: Optional[str] = None) -> dict[str, Any]:
        return self._chunk([{"index": 0, "text": text, "logprobs": None,
                             "finish_reason": finish_reason}])


def chat_delta_payload(delta: Delta) -> dict[str, Any]:
    """The OpenAI `delta` object of one parser delta: a call's id, type and name come once, in its
    first chunk, then argument fragments keyed by the call's index."""
    if isinstance(delta, ContentDelta):
        return {"content": delta.text}
    if isinstance(delta, ReasoningDelta):
        return {"reasoning_content": delta.text}
    if isinstance(delta, ToolCallStart):
        return {"tool_calls": [{"index": delta.index, "id": delta.id, "type": "function",
                                "function": {"name": delta.name, "arguments": ""}}]}
    if isinstance(delta, ToolCallArguments):
        return {"tool_calls": [{"index": delta.index, "function": {"arguments": delta.fragment}}]}
    raise TypeError(f"unknown parser delta {delta!r}")


_PUBLIC_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
                   FinishReason.ABORT: "abort", None: "abort"}


@dataclass
class Outcome:
    """How a generation ended, as far as the client is concerned."""

    prompt_tokens: int
    completion_tokens: int = 0
    scheduler_reason: Optional[FinishReason] = None  # None: cancelled before `finished`
    stop_string_matched: bool = False
    tool_calls_completed: bool = False

    @property
    def stopped_on_eos(self) -> bool:
        return self.scheduler_reason is FinishReason.STOP and not self.stop_string_matched

    @property
    def finish_reason(self) -> str:
        if self.stop_string_matched:
            return "stop"
        if self.tool_calls_completed and self.stopped_on_eos:
            return "tool_calls"
        return _PUBLIC_REASONS[self.scheduler_reason]


class AdmittedGeneration:
    """One admitted `Generate` call; read it once, as a body or as SSE events.

    Every way out (done, error, the client gone) cancels the call: a no-op when it had finished.
    """

    def __init__(self, stream: GenerationStream, admission: Admission, header: ResponseHeader,
                 decoder: StoppingDecoder, metrics: FrontendMetrics, timer: RequestTimer,
                 request_id: str = "") -> None:
        self._stream = stream
        self._admission = admission
        self._header = header
        self._decoder = decoder
        self._metrics = metrics
        self._timer = timer
        self._request_id = request_id  # correlation id, for the logs

    async def chat_body(self, thinking: bool, tools: list[dict[str, Any]]) -> dict[str, Any]:
        async with self._tracked() as outcome:
            text = "".join([piece async for piece in self._text_pieces(outcome)])
            content, reasoning, calls = _parse_chat_text(text, outcome.stopped_on_eos, thinking,
                                                         tools)
            outcome.tool_calls_completed = bool(calls)
        return chat_completion_body(self._header, chat_message(content, reasoning, calls),
                                    outcome.finish_reason,
                                    usage_body(outcome.prompt_tokens, outcome.completion_tokens))

    async def chat_events(self, thinking: bool, tools: list[dict[str, Any]],
                          include_usage: bool) -> AsyncIterator[bytes]:
        chunks = ChatChunks(self._header, include_usage)
        parser = StreamingParser(thinking, tools)
        yield sse_event(chunks.delta({"role": "assistant", "content": ""}))
        try:
            async with self._tracked() as outcome:
                async for text in self._text_pieces(outcome):
                    for delta in parser.feed(text):
                        yield sse_event(chunks.delta(chat_delta_payload(delta)))
                for delta in parser.finish(outcome.stopped_on_eos):
                    yield sse_event(chunks.delta(chat_delta_payload(delta)))
                outcome.tool_calls_completed = bool(parser.outcome.tool_calls)
                _log_parse_error(parser.outcome.error, outcome.stopped_on_eos)
            yield sse_event(chunks.delta({}, outcome.finish_reason))
            if include_usage:
                yield sse_event(chunks.usage(outcome.prompt_tokens, outcome.completion_tokens))
        except Exception as error:  # headers are out: the stream must still end with an error event
            yield sse_event(stream_error_body(error))
        yield SSE_DONE

    async def text_body(self) -> dict[str, Any]:
        async with self._tracked() as outcome:
            text = "".join([piece async for piece in self._text_pieces(outcome)])
        return text_completion_body(self._header, text, outcome.finish_reason,
                                    usage_body(outcome.prompt_tokens, outcome.completion_tokens))

    async def text_events(self, include_usage: bool) -> AsyncIterator[bytes]:
        chunks = TextChunks(self._header, include_usage)
        try:
            async with self._tracked() as outcome:
                async for text in self._text_pieces(outcome):
                    yield sse_event(chunks.text(text))
            yield sse_event(chunks.text("", outcome.finish_reason))
            if include_usage:
                yield sse_event(chunks.usage(outcome.prompt_tokens, outcome.completion_tokens))
        except Exception as error:  # headers are out: the stream must still end with an error event
            yield sse_event(stream_error_body(error))
        yield SSE_DONE

    async def _text_pieces(self, outcome: Outcome) -> AsyncIterator[str]:
        """Client-visible text; fills `outcome`. A stop-string match cancels the call."""
        received_tokens = 0
        async for event in self._stream.events():
            if isinstance(event, TokenBatch):
                self._timer.on_tokens()
                received_tokens += len(event.token_ids)
                scan = self._decoder.feed(event.token_ids)
                if scan.text:
                    yield scan.text
                if scan.matched:
                    self._stream.cancel()
                    outcome.stop_string_matched = True
                    outcome.completion_tokens = received_tokens
                    return
            elif isinstance(event, Finish):
                outcome.scheduler_reason = event.reason
                outcome.prompt_tokens = event.prompt_tokens or outcome.prompt_tokens
                outcome.completion_tokens = event.completion_tokens
        scan = self._decoder.finish()
        outcome.stop_string_matched = scan.matched
        if scan.text:
            yield scan.text

    @contextlib.asynccontextmanager
    async def _tracked(self) -> AsyncIterator[Outcome]:
        outcome = Outcome(self._admission.prompt_tokens)
        self._metrics.request_started()
        try:
            yield outcome
        except SchedulerError as error:
            if isinstance(error, RequestTimedOut):
                self._metrics.count_timeout()
            log.warning("%s: failed after admission: %s", self._header.response_id, error,
                        extra={"request_id": self._request_id})
            raise
        finally:
            self._metrics.request_ended()
            self._stream.cancel()
        self._timer.on_finished(outcome.prompt_tokens, outcome.completion_tokens,
                                outcome.finish_reason)
        log.info("%s: finished (%s, %d prompt + %d completion tokens)", self._header.response_id,
                 outcome.finish_reason, outcome.prompt_tokens, outcome.completion_tokens,
                 extra={"request_id": self._request_id})


def stream_error_body(error: Exception) -> dict[str, Any]:
    """The SSE error event that ends a stream which failed after its headers were sent."""
    if isinstance(error, SchedulerError):
        return error_body(f"generation failed: {error.message}", "server_error", None,
                          error.code.name)
    log.exception("internal error while streaming a response")
    return error_body(f"internal server error: {type(error).__name__}", "server_error", None, None)


def _parse_chat_text(text: str, stopped_on_eos: bool, thinking: bool,
                     tools: list[dict[str, Any]]) -> tuple[str, str, list[dict[str, Any]]]:
    """(content, reasoning, completed tool calls). On a parse error: the part parsed before it."""
    try:
        parsed = parse_completion(text, thinking, tools, stopped_on_eos=stopped_on_eos)
    except DsmlParseError as error:
        _log_parse_error(error, stopped_on_eos)
        safe = error.partial
        return (safe.content, safe.reasoning_content, []) if safe else ("", "", [])
    calls = [tool_call_body(call.id, call.name, call.arguments_json) for call in parsed.tool_calls]
    return parsed.content, parsed.reasoning_content, calls


def _log_parse_error(error: Optional[DsmlParseError], stopped_on_eos: bool) -> None:
    """Output cut short (max_tokens, a stop string) is expected to be incomplete; only a malformed
    message that the model ended itself is worth an operator's attention."""
    if error is not None and stopped_on_eos:
        log.info("model output is not a well-formed V4 message (%s); withheld the rest", error)
