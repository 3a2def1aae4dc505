"""Admission checks: turn a Generate call into a `Request` or reject it before `admitted`.

Every rejection names the numbers involved, because the frontend shows the message to the client.
"""
from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.errors import ErrorKind, SchedulerError
from services.scheduler.requests import AdmittedEvent, EventSink, GenerateParams, Request


# Retry-After of a back-pressure refusal: about how long a step batch takes to drain a few requests.
QUEUE_FULL_RETRY_AFTER_S = 1


@dataclass(frozen=True)
class AdmissionLimits:
    max_model_len: int
    default_max_new_tokens: int
    vocab_size: int


def admit(params: GenerateParams, limits: AdmissionLimits, arrival: int,
          emit: EventSink) -> tuple[Request, AdmittedEvent]:
    """Validate and size the request; raises SchedulerError(INVALID_ARGUMENT) when it cannot run."""
    prompt_len = len(params.prompt_token_ids)
    _check_prompt(params, limits)
    room = limits.max_model_len - prompt_len
    asked = params.max_tokens if params.max_tokens is not None else limits.default_max_new_tokens
    if asked < 1:
        raise SchedulerError(ErrorKind.INVALID_ARGUMENT,
                             f"max_tokens must be at least 1, got {asked}")
    if params.ignore_eos and params.constraint is not None:
        raise SchedulerError(ErrorKind.INVALID_ARGUMENT,
                             "ignore_eos is only supported for unconstrained requests")
    max_tokens = min(asked, room)
    request = Request(
        request_id=params.request_id, prompt_token_ids=list(params.prompt_token_ids),
        max_tokens=max_tokens, logit_bias=params.logit_bias, ignore_eos=params.ignore_eos,
        constraint=params.constraint, emit=emit, arrival=arrival,
        correlation_id=params.correlation_id or params.request_id)
    admitted = AdmittedEvent(prompt_tokens=prompt_len, max_tokens=max_tokens,
                             constrained=params.constraint is not None,
                             max_tokens_capped=max_tokens < asked)
    return request, admitted


def _check_prompt(params: GenerateParams, limits: AdmissionLimits) -> None:
    prompt_len = len(params.prompt_token_ids)
    if prompt_len == 0:
        raise SchedulerError(ErrorKind.INVALID_ARGUMENT, "the prompt is empty (0 tokens)")
    if prompt_len > limits.max_model_len - 1:
        raise SchedulerError(
            ErrorKind.INVALID_ARGUMENT,
            f"the prompt has {prompt_len} tokens but max_model_len is {limits.max_model_len}: "
            f"at most {limits.max_model_len - 1} prompt tokens leave room for one generated token")
    bad = next((t for t in params.prompt_token_ids if t >= limits.vocab_size), None)
    if bad is not None:
        raise SchedulerError(ErrorKind.INVALID_ARGUMENT,
                             f"prompt token id {bad} is outside the vocabulary "
                             f"(size {limits.vocab_size})")
    bad_bias = next((t for t, _ in params.logit_bias if t >= limits.vocab_size), None)
    if bad_bias is not None:
        raise SchedulerError(ErrorKind.INVALID_ARGUMENT,
                             f"logit_bias token id {bad_bias} is outside the vocabulary "
                             f"(size {limits.vocab_size})")


def check_queue_room(limit: int, queued: int) -> None:
    """Back-pressure: refuse when `limit` (--max-waiting-requests; 0: none) requests are already
    queued (waiting, including preempted ones, plus grammar-pending)."""
    if limit and queued >= limit:
        raise SchedulerError(ErrorKind.UNAVAILABLE,
                             f"overloaded: {queued} requests are queued (--max-waiting-requests "
                             f"{limit}); retry later", retry_after_s=QUEUE_FULL_RETRY_AFTER_S)
