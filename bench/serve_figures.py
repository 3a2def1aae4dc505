"""Figures of one load level of bench/serve.py (percentiles of TTFT, TPOT and ITL, throughput,
errors) and the plot of a sweep."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from bench.serve_requests import RequestRecord

PERCENTILES = (50, 90, 99)


def distribution_ms(values_s: Sequence[float]) -> dict[str, Optional[float]]:
    """mean and p50/p90/p99 in milliseconds (None when there are no values)."""
    if not values_s:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    values_ms = np.asarray(values_s, dtype=float) * 1e3
    figures = {"mean": float(values_ms.mean())}
    figures.update({f"p{p}": float(np.percentile(values_ms, p)) for p in PERCENTILES})
    return figures


def latency_figures(records: Sequence[RequestRecord]) -> dict[str, dict[str, Optional[float]]]:
    done = [r for r in records if r.ok]
    return {"ttft_ms": distribution_ms([r.ttft_s for r in done if r.ttft_s is not None]),
            "tpot_ms": distribution_ms([r.tpot_s for r in done if r.tpot_s is not None]),
            "itl_ms": distribution_ms([gap for r in done for gap in r.itl_s])}


def summarize(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
    """The figures of one level: all requests, then constrained and plain ones apart."""
    done = [r for r in records if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    return {"requests": len(records), "completed": len(done),
            "errors": dict(Counter(r.error for r in records if not r.ok)),
            "duration_s": duration_s, "output_tokens": output_tokens,
            "request_throughput_per_s": len(done) / duration_s if duration_s > 0 else 0.0,
            "output_throughput_tok_per_s": output_tokens / duration_s if duration_s > 0 else 0.0,
            **latency_figures(records),
            "constrained": latency_figures([r for r in records if r.constrained]),
            "plain": latency_figures([r for r in records if not r.constrained])}


def format_level(label: str, figures: dict[str, Any]) -> str:
    """One level as the table rows bench/serve.py prints."""
    lines = [f"== {label}: {figures['completed']}/{figures['requests']} completed in "
             f"{figures['duration_s']:.2f} s, errors {figures['errors'] or 0}",
             f"   throughput {figures['request_throughput_per_s']:.2f} req/s, "
             f"{figures['output_throughput_tok_per_s']:.1f} output tok/s "
             f"({figures['output_tokens']} tokens)"]
    for name in ("ttft_ms", "tpot_ms", "itl_ms"):
        lines.append(f"   {name[:-3].upper():5s} ms  " + _row(figures[name]))
    for kind in ("constrained", "plain"):
        lines.append(f"   ITL {kind:11s}  " + _row(figures[kind]["itl_ms"]))
    return "\n".join(lines)


def _row(distribution: dict[str, Optional[float]]) -> str:
    return "  ".join(f"{key} {_ms(value)}" for key, value in distribution.items())


def _ms(value: Optional[float]) -> str:
    return "    -" if value is None else f"{value:7.1f}"


def plot_sweep(levels: list[dict[str, Any]], x_label: str, path: Path) -> None:
    """Latency (TTFT, TPOT, ITL p50 and p99) and output throughput against the swept value."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    xs = [level["value"] for level in levels]
    figure, (latency, throughput) = pyplot.subplots(1, 2, figsize=(11, 4.2))
    for metric, marker in (("ttft_ms", "o"), ("tpot_ms", "s"), ("itl_ms", "^")):
        for percentile, line in (("p50", "-"), ("p99", "--")):
            ys = [_nan(level["figures"][metric][percentile]) for level in levels]
            latency.plot(xs, ys, marker=marker, linestyle=line,
                         label=f"{metric[:-3].upper()} {percentile}")
    latency.set(xlabel=x_label, ylabel="ms", title="latency", yscale="log")
    throughput.plot(xs, [level["figures"]["output_throughput_tok_per_s"] for level in levels],
                    "o-", label="output tok/s")
    throughput.set(xlabel=x_label, ylabel="tokens / s", title="output throughput")
    for axes in (latency, throughput):
        if len(xs) > 1 and min(xs) > 0:
            axes.set_xscale("log", base=2)
        axes.set_xticks(xs, [f"{x:g}" for x in xs])
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _nan(value: Optional[float]) -> float:
    return float("nan") if value is None else value
