"""Prometheus metrics of one frontend process, exposed with `prometheus_client`.

Latency histograms and token counters are measured here, per frontend (so a scaled-out gateway sums
correctly). Queue and cache gauges come from the scheduler's `GetSchedulerState` at scrape time;
they describe the whole deployment. Names follow vLLM where vLLM has one, `dsv4serve:` otherwise.

One frontend is one process (`serve` runs a single uvicorn server on one event loop; replicas
scale out as separate processes, each scraped on its own), so each app keeps its own
`CollectorRegistry` and prometheus_client's multiprocess mode is not needed.
"""
from __future__ import annotations

import time
from typing import Iterator, Optional

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.frontend.scheduler_values import PartitionStats, SchedulerSnapshot

# `_created` samples would double every counter and histogram without telling an operator anything.
prometheus_client.disable_created_metrics()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                      5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4,
                  0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
_MODEL = ["model_name"]


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
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r, m = self.registry, model_name
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "Time from request arrival to its first output token.", _MODEL,
                              buckets=_LATENCY_BUCKETS_S, registry=r).labels(m)
        self.inter_token = Histogram("vllm:inter_token_latency_seconds",
                                     "Time between consecutive output token batches.", _MODEL,
                                     buckets=_ITL_BUCKETS_S, registry=r).labels(m)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Time from request arrival to its end.",
                             _MODEL, buckets=_LATENCY_BUCKETS_S, registry=r).labels(m)
        self._prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.",
                                      _MODEL, registry=r).labels(m)
        self._generation_tokens = Counter("vllm:generation_tokens",
                                          "Generated tokens of finished requests.", _MODEL,
                                          registry=r).labels(m)
        self._finished = Counter("vllm:request_success", "Finished requests by finish reason.",
                                 [*_MODEL, "finished_reason"], registry=r)
        self._in_flight = Gauge("dsv4serve:frontend_requests_in_flight",
                                "Requests this frontend is serving now.", _MODEL, registry=r).labels(m)
        self._rejected = Counter("dsv4serve:requests_rejected",
                                 "Requests refused before admission: queue_full (the scheduler's "
                                 "--max-waiting-requests) or shutting_down.",
                                 [*_MODEL, "reason"], registry=r)
        self._timeouts = Counter("dsv4serve:request_timeouts",
                                 "Requests ended by --request-timeout-s.", _MODEL, registry=r).labels(m)
        self._cut_at_shutdown = Counter("dsv4serve:requests_cut_at_shutdown",
                                        "Requests still running when the shutdown grace ended.",
                                        _MODEL, registry=r).labels(m)

    def timer(self) -> RequestTimer:
        return RequestTimer(self)

    def request_started(self) -> None:
        self._in_flight.inc()

    def request_ended(self) -> None:
        self._in_flight.dec()

    def count_finished(self, prompt_tokens: int, completion_tokens: int, finish_reason: str) -> None:
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc(completion_tokens)
        self._finished.labels(self.model_name, finish_reason).inc()

    def count_rejected(self, reason: str) -> None:
        self._rejected.labels(self.model_name, reason).inc()

    def count_timeout(self) -> None:
        self._timeouts.inc()

    def count_cut_at_shutdown(self, count: int) -> None:
        self._cut_at_shutdown.inc(count)

    def render(self, scheduler: Optional[SchedulerSnapshot]) -> bytes:
        """The exposition text; scheduler gauges are left out when the scheduler did not answer."""
        scrape = CollectorRegistry()
        scrape.register(_SchedulerCollector(self.model_name, scheduler))
        return prometheus_client.generate_latest(self.registry) + prometheus_client.generate_latest(scrape)


class _SchedulerCollector:
    """The deployment-wide numbers of one `GetSchedulerState` answer, as metric families."""

    def __init__(self, model_name: str, snapshot: Optional[SchedulerSnapshot]) -> None:
        self._model_name = model_name
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield self._family(GaugeMetricFamily, "dsv4serve:scheduler_up",
                           "1 when the scheduler answered this scrape.", int(self._snapshot is not None))
        if self._snapshot is None:
            return
        for name, family, help_text, value in _scheduler_samples(self._snapshot):
            yield self._family(family, name, help_text, value)
        yield from self._partition_families(self._snapshot.partitions)
        yield self._per_pos("dsv4serve:spec_decode_num_accepted_tokens_per_pos",
                            "Drafted tokens accepted, by draft position.",
                            self._snapshot.spec_decode_num_accepted_tokens_per_pos)
        yield self._per_pos("dsv4serve:spec_decode_num_draft_tokens_per_pos",
                            "Drafted (not grammar-forced) tokens verified, by draft position.",
                            self._snapshot.spec_decode_num_draft_tokens_per_pos)
        yield self._per_pos("dsv4serve:spec_decode_num_accepted_proposals_per_pos",
                            "Drafter proposals equal to the committed token, with every one "
                            "before them in their set, by index in the set.",
                            self._snapshot.spec_decode_num_accepted_proposals_per_pos)

    def _per_pos(self, name: str, help_text: str, counts: tuple[int, ...]) -> Metric:
        metric = CounterMetricFamily(name, help_text, labels=_MODEL + ["position"])
        for position, count in enumerate(counts):
            metric.add_metric([self._model_name, str(position)], count)
        return metric

    def _partition_families(self, partitions: tuple[PartitionStats, ...]) -> Iterator[Metric]:
        """Per cache partition (DP group): running and waiting requests, cache usage, prefix
        cache."""
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        for family, name, help_text, value_of in (
                (gauge, "dsv4serve:partition_requests_running", "Running requests of one partition.",
                 lambda p: p.running),
                (gauge, "dsv4serve:partition_requests_waiting", "Requests waiting in one partition.",
                 lambda p: p.waiting),
                (gauge, "dsv4serve:partition_kv_cache_usage_perc",
                 "Fraction of one partition's KV-cache blocks in use.",
                 lambda p: p.used_blocks / p.total_blocks if p.total_blocks else 0.0),
                (gauge, "dsv4serve:partition_prefix_cache_blocks",
                 "Blocks of one partition held by its prefix cache (all groups).",
                 lambda p: p.cached_blocks),
                (counter, "dsv4serve:partition_prefix_cache_queries",
                 "Prefix cache queries of one partition, in tokens.",
                 lambda p: p.prefix_cache_queries),
                (counter, "dsv4serve:partition_prefix_cache_hits",
                 "Prefix cache hits of one partition, in tokens.", lambda p: p.prefix_cache_hits)):
            metric = family(name, help_text, labels=_MODEL + ["partition"])
            for partition in partitions:
                metric.add_metric([self._model_name, str(partition.partition_id)],
                                  value_of(partition))
            yield metric

    def _family(self, family: type, name: str, help_text: str, value: float) -> Metric:
        metric = family(name, help_text, labels=_MODEL)
        metric.add_metric([self._model_name], value)
        return metric


def _scheduler_samples(s: SchedulerSnapshot) -> list[tuple[str, type, str, float]]:
    gauge, counter = GaugeMetricFamily, CounterMetricFamily
    usage = s.used_blocks / s.total_blocks if s.total_blocks else 0.0
    return [
        ("vllm:num_requests_running", gauge, "Requests in the running batch.", s.num_running),
        ("vllm:num_requests_waiting", gauge, "Requests waiting to be scheduled.", s.num_waiting),
        ("vllm:kv_cache_usage_perc", gauge, "Fraction of KV-cache blocks in use (1 = full).", usage),
        ("vllm:num_preemptions_total", counter, "Preemptions by recompute.", s.preemptions_total),
        ("vllm:prefix_cache_queries", counter,
         "Prefix cache queries, in terms of number of queried tokens.", s.prefix_cache_queries_total),
        ("vllm:prefix_cache_hits", counter,
         "Prefix cache hits, in terms of number of cached tokens.", s.prefix_cache_hits_total),
        ("dsv4serve:constrained_preemptions_total", counter,
         "Constrained requests preempted and replayed (--preempt-constrained replay).",
         s.constrained_preemptions_total),
        ("dsv4serve:num_requests_grammar_pending", gauge,
         "Requests waiting for their grammar to compile.", s.num_grammar_pending),
        ("dsv4serve:num_constrained_requests_running", gauge,
         "Constrained requests in the running batch.", s.num_constrained_running),
        ("dsv4serve:num_live_grammar_matchers", gauge, "Grammar matchers held by live requests.",
         s.num_live_matchers),
        ("dsv4serve:grammar_cache_entries", gauge, "Compiled grammars cached.", s.grammar_cache_entries),
        ("dsv4serve:scheduler_steps_total", counter, "Scheduler steps run.", s.steps_total),
        ("dsv4serve:step_seconds_total", counter,
         "Seconds the workers spent on steps as the scheduler sees them (send, or the previous "
         "step's answer, to answer).", s.step_seconds_total),
        ("dsv4serve:worker_forward_seconds_total", counter,
         "Of those, seconds the workers' ranks computed (slowest worker per step).",
         s.worker_forward_seconds_total),
        ("dsv4serve:stall_rejections_total", counter,
         "Constrained requests rejected because no progress was possible.", s.stall_rejections_total),
        ("dsv4serve:scheduler_prompt_tokens_total", counter,
         "Prompt tokens admitted by the scheduler (all frontends).", s.prompt_tokens_total),
        ("dsv4serve:scheduler_generation_tokens_total", counter,
         "Tokens generated by the scheduler (all frontends).", s.generation_tokens_total),
        ("dsv4serve:spec_decode_num_drafts", counter,
         "Verify rows with at least one drafted token.", s.spec_decode_num_drafts),
        ("dsv4serve:spec_decode_num_draft_tokens", counter, "Drafted tokens verified.",
         s.spec_decode_num_draft_tokens),
        ("dsv4serve:spec_decode_num_accepted_tokens", counter, "Drafted tokens accepted.",
         s.spec_decode_num_accepted_tokens),
        ("dsv4serve:spec_decode_num_forced_tokens", counter,
         "Grammar-forced draft tokens (accepted with their prefix).",
         s.spec_decode_num_forced_tokens),
        ("dsv4serve:spec_decode_num_proposal_sets", counter,
         "Drafter proposal sets checked against the tokens committed after them.",
         s.spec_decode_num_proposal_sets),
    ]
