"""Load generation against a running stack started by the project's launcher (used by the benches).

Streams are timed client-side: the time of every content chunk is recorded, so decode throughput
and inter-token latency come from what a client actually observes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stream:
    token_times: list[float]  # one entry per streamed chunk that carried output

    @property
    def decode_tokens(self) -> int:
        return max(0, len(self.token_times) - 1)


class LocalStack:
    """`dsv4serve stack` on free ports; a context manager that always stops it."""

    def __init__(self, model_dir: Path, extra_args: tuple[str, ...] = ()) -> None:
        self._model_dir = model_dir
        self._extra = extra_args
        self._dir = Path(tempfile.mkdtemp(prefix="dsv4serve-bench-"))
        self._process: Optional[subprocess.Popen] = None
        self.base_url = ""

    def __enter__(self) -> "LocalStack":
        ready = self._dir / "ready.json"
        log = (self._dir / "launcher.log").open("wb")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "stack", "--model", str(self._model_dir), "--port", "0",
             "--scheduler-port", "0", "--worker-port", "0", "--served-model-name", "bench",
             "--log-dir", str(self._dir / "logs"), "--ready-file", str(ready), *self._extra],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 600
        while not ready.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the stack did not start; see {self._dir}")
            time.sleep(0.2)
        self.base_url = json.loads(ready.read_text())["base_url"]
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            self._process.wait(timeout=60)


def _stream(base_url: str, path: str, body: dict[str, Any]) -> Stream:
    times = []
    with httpx.Client(base_url=base_url, timeout=600, trust_env=False) as http:
        with http.stream("POST", path, json={**body, "stream": True}) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: "):])
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta", {})
                    if choice.get("text") or delta.get("content") or delta.get("reasoning_content"):
                        times.append(time.perf_counter())
    return Stream(times)


def concurrent_streams(base_url: str, path: str, bodies: list[dict[str, Any]]) -> list[Stream]:
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(lambda body: _stream(base_url, path, body), bodies))


def decode_tokens_per_s(streams: list[Stream]) -> float:
    """Tokens per second while every stream is decoding (from the last stream's first token to
    the first stream's last token, so staggered arrivals and prefills do not count): the sum of
    each stream's own rate in that window, from its first to its last token there. Counting all
    streams' tokens over the window's span instead reads ~3% low at 32 steps: the window ends on
    the earliest-seen last token, which drops the rest of that step's tokens (a client thread sees
    a token even 2 ms late)."""
    started = max(s.token_times[0] for s in streams)
    ended = min(s.token_times[-1] for s in streams)
    rates = []
    for stream in streams:
        inside = [t for t in stream.token_times if started <= t <= ended]
        if len(inside) > 1:
            rates.append((len(inside) - 1) / (inside[-1] - inside[0]))
    return sum(rates)


def mean_inter_token_ms(streams: list[Stream]) -> float:
    gaps = [b - a for s in streams for a, b in zip(s.token_times, s.token_times[1:])]
    return 1000 * sum(gaps) / len(gaps)


def token_prompts(batch: int, length: int, vocab: int = 128000) -> Iterator[list[int]]:
    for i in range(batch):
        yield [0] + [(97 * i + 13 * j + 5) % vocab + 3 for j in range(length - 1)]
