"""The end-to-end bench's decode rate reads the stack's true rate from client-side token times:
jitter in when a client thread sees a token, and staggered starts, do not bias it."""
from __future__ import annotations

import random

from bench.stack_load import Stream, decode_tokens_per_s

STEP_S = 0.07
BATCH = 32


def streams(jitter_s: float, first_steps: list[int], steps: int = 33) -> list[Stream]:
    jitter = random.Random(7)
    return [Stream(token_times=[(first + k) * STEP_S + jitter.uniform(0, jitter_s)
                                for k in range(steps)]) for first in first_steps]


def test_client_jitter_does_not_bias_the_decode_rate():
    for jitter_s in (0.0, 0.002, 0.02):
        rate = decode_tokens_per_s(streams(jitter_s, [0] * BATCH))
        assert abs(rate * STEP_S / BATCH - 1) < 0.01, jitter_s


def test_streams_that_start_later_count_only_while_all_decode():
    rate = decode_tokens_per_s(streams(0.002, [i % 4 for i in range(BATCH)]))
    assert abs(rate * STEP_S / BATCH - 1) < 0.01
