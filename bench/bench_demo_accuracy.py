"""Held-out tool-call accuracy of the demo model, through a running stack.

    dsv4serve stack &                                   # the default model is the demo model
    python -m bench.bench_demo_accuracy --url http://127.0.0.1:8000 [--count 100]

The prompts are the committed held-out set (`services/demo/weights/heldout.json`: phrasings, names
and values that never occur in training). To choose among candidate models without wearing out
that set, give `--heldout RUN/heldout.json --skip 100` of a run written with `--heldout-count 200`:
its prompts 100-199 are held out the same way, and the first 100 stay for the figure reported.
Two modes, `tool_choice: "auto"` both times:
- `auto`: no tool is strict, so nothing constrains decoding — the model writes the DSML itself;
- `strict`: every tool is strict, so a call the model starts is grammar-constrained.
A prompt is right when the response has exactly one call, of the expected tool, whose arguments
equal the expected ones, and finish_reason is `tool_calls`. Prints one line per mode and, against a
stack started with `--speculative-config`, each mode's draft acceptance per position from the
/metrics counters: the share of verify rows whose drafted token at that position was accepted
(vLLM's figure), and the share of drafted tokens there that were accepted (the drafter's figure:
in strict mode grammar-forced tokens fill some positions, and those are neither drafted nor
counted as accepted).
"""
from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from prometheus_client.parser import text_string_to_metric_families

from services.demo.export import COMPACT_DIR, HELDOUT_FILE

MODES = ("auto", "strict")
COMMITTED_HELDOUT = COMPACT_DIR / HELDOUT_FILE
MAX_TOKENS = 256


@dataclass(frozen=True)
class Verdict:
    right: bool
    calls: int          # calls in the response
    valid_calls: int    # calls of a declared tool whose arguments validate against its schema
    detail: str


def load_heldout(count: int, path: Path = COMMITTED_HELDOUT, skip: int = 0) -> list[dict[str, Any]]:
    """Prompts skip … skip + count − 1 of `path`; fewer there is an error, not a smaller set."""
    entries = json.loads(path.read_text(encoding="utf-8"))[skip:skip + count]
    if len(entries) < count:
        raise SystemExit(f"{path} holds {len(entries)} prompts after the first {skip}, not {count}")
    return entries


def request_body(entry: dict[str, Any], mode: str, model: str) -> dict[str, Any]:
    tools = []
    for tool in entry["request"]["tools"]:
        function = {k: v for k, v in tool["function"].items() if k != "strict"}
        if mode == "strict":
            function["strict"] = True
        tools.append({**tool, "function": function})
    return {**entry["request"], "tools": tools, "tool_choice": "auto", "model": model,
            "temperature": 0, "max_tokens": MAX_TOKENS}


def judge(entry: dict[str, Any], body: dict[str, Any], response: dict[str, Any]) -> Verdict:
    choice = response["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    parsed, valid = [], 0
    for call in calls:
        name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
        parsed.append((name, arguments))
        if name in schemas and jsonschema.Draft202012Validator(schemas[name]).is_valid(arguments):
            valid += 1
    expected = (entry["expected"]["name"], entry["expected"]["arguments"])
    right = choice["finish_reason"] == "tool_calls" and parsed == [expected]
    detail = f"expected {expected}, got {parsed or repr(choice['message'].get('content'))[:120]}"
    return Verdict(right, len(calls), valid, detail)


def evaluate(base_url: str, model: str, entries: list[dict[str, Any]], mode: str,
             workers: int = 8) -> list[Verdict]:
    with httpx.Client(base_url=base_url, timeout=600, trust_env=False) as client:
        def one(entry: dict[str, Any]) -> Verdict:
            body = request_body(entry, mode, model)
            response = client.post("/v1/chat/completions", json=body)
            response.raise_for_status()
            return judge(entry, body, response.json())

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, entries))


TOTALS = {"dsv4serve:spec_decode_num_drafts_total": "drafts",
          "dsv4serve:spec_decode_num_proposal_sets_total": "proposal_sets"}
PER_POSITION = {"dsv4serve:spec_decode_num_accepted_tokens_per_pos_total": "accepted",
                "dsv4serve:spec_decode_num_draft_tokens_per_pos_total": "drafted",
                "dsv4serve:spec_decode_num_accepted_proposals_per_pos_total": "proposed"}


@dataclass(frozen=True)
class SpecCounts:
    """Verify rows with a draft and the drafter's proposal sets checked; per position, drafted
    tokens accepted and verified, and proposals accepted with every one before them; so far."""

    drafts: float
    proposal_sets: float
    accepted: list[float]
    drafted: list[float]
    proposed: list[float]


def spec_counters(base_url: str) -> SpecCounts:
    text = httpx.get(f"{base_url}/metrics", trust_env=False).text
    totals, per_position = {}, {kind: {} for kind in PER_POSITION.values()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in TOTALS:
                totals[TOTALS[sample.name]] = sample.value
            elif sample.name in PER_POSITION:
                position = int(sample.labels["position"])
                per_position[PER_POSITION[sample.name]][position] = sample.value
    return SpecCounts(**{kind: totals.get(kind, 0.0) for kind in TOTALS.values()},
                      **{kind: [counts[k] for k in sorted(counts)]
                         for kind, counts in per_position.items()})


def _growth(before: list[float], after: list[float]) -> list[float]:
    return [a - (before[i] if i < len(before) else 0.0) for i, a in enumerate(after)]


def acceptance_line(before: SpecCounts, after: SpecCounts) -> str:
    """Per position: the drafter's proposals accepted with every one before them, over its
    proposal sets (vLLM's figure: a grammar-forced token counts where the drafter proposed it,
    as it would have to be in a stack that forces none); accepted drafted tokens over verify rows;
    and over the rows whose token there was drafted rather than forced."""
    drafts = after.drafts - before.drafts
    if not drafts:
        return "no drafts (start the stack with --speculative-config)"
    sets = after.proposal_sets - before.proposal_sets
    proposed = _growth(before.proposed, after.proposed)
    accepted = _growth(before.accepted, after.accepted)
    drafted = _growth(before.drafted, after.drafted)
    return (f"{int(sets)} proposal sets, accepted per position "
            + " ".join(f"{n / sets:.1%}" for n in proposed)
            + f"; {int(drafts)} verify rows, drafted tokens accepted "
            + " ".join(f"{n / drafts:.0%}" for n in accepted)
            + "; of drafted (not forced) tokens there "
            + " ".join(f"{n / d:.0%}" if d else "-" for n, d in zip(accepted, drafted)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="served model name (default: /v1/models)")
    parser.add_argument("--heldout", type=Path, default=COMMITTED_HELDOUT,
                        help="held-out prompts (a run's heldout.json; default: the committed set)")
    parser.add_argument("--skip", type=int, default=0, help="start after this many prompts")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--show-failures", type=int, default=5)
    args = parser.parse_args()
    model = args.model or httpx.get(f"{args.url}/v1/models", trust_env=False).json()["data"][0]["id"]
    entries = load_heldout(args.count, args.heldout, args.skip)
    for mode in MODES:
        before = spec_counters(args.url)
        verdicts = evaluate(args.url, model, entries, mode, args.workers)
        right = sum(v.right for v in verdicts)
        calls = sum(v.calls for v in verdicts)
        valid = sum(v.valid_calls for v in verdicts)
        print(f"{mode:6s}: right {right}/{len(verdicts)} ({right / len(verdicts):.0%}), "
              f"schema-valid calls {valid}/{calls}")
        print(f"        speculation: {acceptance_line(before, spec_counters(args.url))}")
        for verdict in [v for v in verdicts if not v.right][:args.show_failures]:
            print(f"        miss: {verdict.detail}")


if __name__ == "__main__":
    main()
