"""OpenAI responses of one admitted generation: the JSON body or the SSE chunk stream.

`AdmittedGeneration` turns the scheduler's token stream into the client's answer: detokenize, cut at
stop strings (a match cancels the call, so the scheduler aborts the request), parse reasoning and
DSML tool calls, then build the body or the chunks (response_bodies.py).

Policy when the DSML parse fails (output that is not a well-formed V4 message, e.g. cut by
max_tokens inside a call): only what was parsed before the problem is returned, no tool call is
presented, and `finish_reason` stays what the scheduler reported (`length` or `stop`). `tool_calls`
is reported only for calls completed before EOS.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

from services.frontend.dsml_parser import DsmlParseError, StreamingParser, parse_completion
from services.frontend.generation_stream import GenerationStream
from services.frontend.metrics import FrontendMetrics, RequestTimer
from services.frontend.response_bodies import (SSE_DONE, ChatChunks, ResponseHeader, TextChunks,
                                               chat_completion_body, chat_delta_payload,
                                               chat_message, error_body, sse_event,
                                               text_completion_body, tool_call_body, usage_body)
from services.frontend.scheduler_errors import RequestTimedOut, SchedulerError
from services.frontend.scheduler_values import Admission, Finish, FinishReason, TokenBatch
from services.frontend.stop_strings import StoppingDecoder

log = logging.getLogger(__name__)

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
