"""OpenAI response bodies and SSE chunks: builders of plain dicts, no I/O.

The chunk builders keep the per-response constants (id, model, created) in one place so every
chunk of one stream agrees.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from services.frontend.dsml_types import (ContentDelta, Delta, ReasoningDelta, ToolCallArguments,
                                          ToolCallStart)

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
