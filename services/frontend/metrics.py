"""Prometheus metrics of one frontend process, in the text exposition format.

Latency histograms and token counters are measured here, per frontend (so a scaled-out gateway sums
correctly). Queue and cache gauges come from the scheduler's `GetSchedulerState` at scrape time;
they describe the whole deployment. Names follow vLLM where vLLM has one, `dsv4serve:` otherwise.
"""
from __future__ import annotations

import bisect
import time
from typing import Optional

from services.frontend.scheduler_client import SchedulerSnapshot

_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                      5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4,
                  0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self._help = help_text
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)  # last: above every bound
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    def render(self, labels: str) -> list[str]:
        lines = [f"# HELP {self.name} {self._help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip(self._bounds, self._counts):
            cumulative += count
            lines.append(f'{self.name}_bucket{{{labels},le="{bound}"}} {cumulative}')
        lines.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum{{{labels}}} {self._sum}")
        lines.append(f"{self.name}_count{{{labels}}} {self.count}")
        return lines


class RequestTimer:
    """Timestamps of one request; reports TTFT and inter-token gaps to its `FrontendMetrics`."""

    def __init__(self, metrics: "FrontendMetrics") -> None:
        self._metrics = metrics
        self._start = time.perf_counter()
        self._last_token: Optional[float] = None

    def on_tokens(self) -> None:
        now = time.perf_counter()
        if self._last_token is None:
            self._metrics.ttft.observe(now - self._start)
        else:
            self._metrics.inter_token.observe(now - self._last_token)
        self._last_token = now

    def on_finished(self, prompt_tokens: int, completion_tokens: int, finish_reason: str) -> None:
        self._metrics.e2e.observe(time.perf_counter() - self._start)
        self._metrics.count_finished(prompt_tokens, completion_tokens, finish_reason)


class FrontendMetrics:
    """Owned by the app; every request reports through a `RequestTimer`."""

    def __init__(self, model_name: str) -> None:
        escaped = model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        self._labels = f'model_name="{escaped}"'
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Time from request arrival to its first output token.",
                              _LATENCY_BUCKETS_S)
        self.inter_token = Histogram("vllm:inter_token_latency_seconds",
                                     "Time between consecutive output token batches.", _ITL_BUCKETS_S)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Time from request arrival to its end.", _LATENCY_BUCKETS_S)
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished_by_reason: dict[str, int] = {}
        self._requests_in_flight = 0

    def timer(self) -> RequestTimer:
        return RequestTimer(self)

    def request_started(self) -> None:
        self._requests_in_flight += 1

    def request_ended(self) -> None:
        self._requests_in_flight -= 1

    def count_finished(self, prompt_tokens: int, completion_tokens: int, finish_reason: str) -> None:
        self._prompt_tokens += prompt_tokens
        self._generation_tokens += completion_tokens
        self._finished_by_reason[finish_reason] = self._finished_by_reason.get(finish_reason, 0) + 1

    def render(self, scheduler: Optional[SchedulerSnapshot]) -> str:
        """The exposition text; scheduler gauges are left out when the scheduler did not answer."""
        lines: list[str] = []
        for histogram in (self.ttft, self.inter_token, self.e2e):
            lines += histogram.render(self._labels)
        lines += self._sample("vllm:prompt_tokens_total", "counter",
                              "Prompt tokens of finished requests.", self._prompt_tokens)
        lines += self._sample("vllm:generation_tokens_total", "counter",
                              "Generated tokens of finished requests.", self._generation_tokens)
        lines += ["# HELP vllm:request_success_total Finished requests by finish reason.",
                  "# TYPE vllm:request_success_total counter"]
        lines += [f'vllm:request_success_total{{{self._labels},finished_reason="{reason}"}} {count}'
                  for reason, count in sorted(self._finished_by_reason.items())]
        lines += self._sample("dsv4serve:frontend_requests_in_flight", "gauge",
                              "Requests this frontend is serving now.", self._requests_in_flight)
        lines += self._sample("dsv4serve:scheduler_up", "gauge",
                              "1 when the scheduler answered this scrape.", int(scheduler is not None))
        if scheduler is not None:
            lines += self._scheduler_lines(scheduler)
        return "\n".join(lines) + "\n"

    def _scheduler_lines(self, s: SchedulerSnapshot) -> list[str]:
        usage = s.used_blocks / s.total_blocks if s.total_blocks else 0.0
        samples = [
            ("vllm:num_requests_running", "gauge", "Requests in the running batch.", s.num_running),
            ("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", s.num_waiting),
            ("vllm:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (1 = full).",
             usage),
            ("vllm:num_preemptions_total", "counter", "Preemptions by recompute.", s.preemptions_total),
            ("dsv4serve:num_requests_grammar_pending", "gauge",
             "Requests waiting for their grammar to compile.", s.num_grammar_pending),
            ("dsv4serve:num_constrained_requests_running", "gauge",
             "Constrained requests in the running batch.", s.num_constrained_running),
            ("dsv4serve:num_live_grammar_matchers", "gauge",
             "Grammar matchers held by live requests.", s.num_live_matchers),
            ("dsv4serve:grammar_cache_entries", "gauge", "Compiled grammars cached.",
             s.grammar_cache_entries),
            ("dsv4serve:scheduler_steps_total", "counter", "Scheduler steps run.", s.steps_total),
            ("dsv4serve:stall_rejections_total", "counter",
             "Constrained requests rejected because no progress was possible.",
             s.stall_rejections_total),
            ("dsv4serve:scheduler_prompt_tokens_total", "counter",
             "Prompt tokens admitted by the scheduler (all frontends).", s.prompt_tokens_total),
            ("dsv4serve:scheduler_generation_tokens_total", "counter",
             "Tokens generated by the scheduler (all frontends).", s.generation_tokens_total),
        ]
        lines: list[str] = []
        for name, kind, help_text, value in samples:
            lines += self._sample(name, kind, help_text, value)
        return lines

    def _sample(self, name: str, kind: str, help_text: str, value: float) -> list[str]:
        return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                f"{name}{{{self._labels}}} {value}"]
