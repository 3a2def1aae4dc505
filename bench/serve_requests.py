"""The workload of bench/serve.py: request bodies drawn from length distributions, and one streamed
chat completion through the real `openai` client, timed as the client sees it."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import openai

# Short common English words: each is one token of the V4 tokenizer (with its leading space), so a
# prompt of n words is close to n prompt tokens.
WORDS = ("the of and to in is for on that with as it at by from this be are or an was but not "
         "have all can one will more out about time when which there so what up use if new").split()
# A strict weather tool: `tool_choice: "required"` with it makes a request grammar-constrained.
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather", "strict": True,
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string"},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 14},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}


@dataclass(frozen=True)
class Workload:
    """How bodies are drawn: lengths uniform in [len·(1−range), len·(1+range)], a share constrained."""

    model: str
    prompt_len: int
    prompt_len_range: float
    output_len: int
    output_len_range: float
    constrained_share: float


@dataclass(frozen=True)
class PlannedRequest:
    constrained: bool
    prompt_words: int
    max_tokens: int
    body: dict[str, Any]


@dataclass
class RequestRecord:
    """What one request looked like from the client: times are seconds since its start."""

    constrained: bool
    prompt_words: int
    max_tokens: int
    ttft_s: Optional[float] = None
    latency_s: Optional[float] = None
    # Chunks that carried visible output (content, reasoning, tool-call deltas): a constrained
    # request's markup tokens show none, so its first chunk may come several tokens late.
    chunk_times_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> Optional[float]:
        """Time per output token after the first (vLLM's TPOT); None below two tokens."""
        if not self.ok or self.output_tokens < 2 or self.ttft_s is None:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive output chunks."""
        return [b - a for a, b in zip(self.chunk_times_s, self.chunk_times_s[1:])]


def plan_requests(workload: Workload, count: int, rng: random.Random) -> list[PlannedRequest]:
    """`count` bodies, exactly round(share·count) of them constrained, in random order."""
    constrained = [index < round(workload.constrained_share * count) for index in range(count)]
    rng.shuffle(constrained)
    return [_plan_one(workload, flag, rng) for flag in constrained]


def _plan_one(workload: Workload, constrained: bool, rng: random.Random) -> PlannedRequest:
    words = _draw(workload.prompt_len, workload.prompt_len_range, rng)
    max_tokens = _draw(workload.output_len, workload.output_len_range, rng)
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    body: dict[str, Any] = {"model": workload.model, "max_tokens": max_tokens, "temperature": 0,
                            "messages": [{"role": "user", "content": text}]}
    if constrained:
        body.update(tools=[WEATHER_TOOL], tool_choice="required")
    return PlannedRequest(constrained, words, max_tokens, body)


def _draw(center: int, spread: float, rng: random.Random) -> int:
    low = max(1, round(center * (1 - spread)))
    high = max(low, round(center * (1 + spread)))
    return rng.randint(low, high)


async def run_request(client: openai.AsyncOpenAI, planned: PlannedRequest) -> RequestRecord:
    """Streams one chat completion; an error of any kind is recorded, never raised."""
    record = RequestRecord(planned.constrained, planned.prompt_words, planned.max_tokens)
    started = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            **planned.body, stream=True, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.usage is not None:
                record.output_tokens = chunk.usage.completion_tokens
            if any(_carries_output(choice.delta) for choice in chunk.choices):
                record.chunk_times_s.append(time.perf_counter() - started)
    except openai.APIStatusError as error:
        record.error = f"HTTP {error.status_code}"
    except openai.APIError as error:
        record.error = type(error).__name__
    record.latency_s = time.perf_counter() - started
    if record.ok and record.output_tokens == 0:
        record.error = "no output"
    record.ttft_s = record.chunk_times_s[0] if record.chunk_times_s else None
    return record


def _carries_output(delta: Any) -> bool:
    return bool(delta.content or delta.tool_calls or getattr(delta, "reasoning_content", None))
