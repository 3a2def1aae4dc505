"""The demo's two drafters through the whole stack at K = 7 — its DSpark variant (the demo target
with its trained draft stage) and the demo target's own MTP block chained (tuned for it,
mtp_tune.py): held-out requests get exactly the answers the demo gives without speculation, in
both of the bench's modes, and the drafts are accepted (the structure's tokens the grammar forces
among them, where the drafter proposed them), the chained MTP block's as far as its seventh. The
acceptance figures per position are `bench/bench_demo_accuracy.py`'s (docs/demo-model.md); here
only that there are some."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from bench.bench_demo_accuracy import MODES, load_heldout, request_body, spec_counters
from tests.e2e.conftest import RunningStack, launch_stack

pytestmark = pytest.mark.slow

K7 = '{{"method":"{}","num_speculative_tokens":7}}'
PROMPTS = 6


@pytest.fixture(scope="module")
def demo_dspark_stack(tmp_path_factory: pytest.TempPathFactory,
                      request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    from services.demo.draft_export import demo_dspark_model_dir

    model_dir: Path = demo_dspark_model_dir()
    yield from launch_stack(model_dir, tmp_path_factory.mktemp("demo-dspark"), request,
                            ("--speculative-config", K7.format("dspark")),
                            served_name="dsv4-demo-dspark-e2e")


@pytest.fixture(scope="module")
def demo_mtp_stack(tmp_path_factory: pytest.TempPathFactory,
                   request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    from services.demo.export import default_demo_model_dir

    yield from launch_stack(default_demo_model_dir(), tmp_path_factory.mktemp("demo-mtp"),
                            request, ("--speculative-config", K7.format("mtp")),
                            served_name="dsv4-demo-mtp-e2e")


def answers(stack: RunningStack, mode: str) -> list[tuple[Any, ...]]:
    with httpx.Client(base_url=stack.base_url, timeout=600, trust_env=False) as client:
        choices = [client.post("/v1/chat/completions", json=request_body(
            entry, mode, stack.served_model_name)).json()["choices"][0]
                   for entry in load_heldout(PROMPTS)]
    return [(c["finish_reason"], c["message"].get("content"),
             [(t["function"]["name"], t["function"]["arguments"])
              for t in c["message"].get("tool_calls") or []]) for c in choices]


def test_the_trained_draft_is_accepted_and_changes_no_token(demo_stack, demo_dspark_stack) -> None:
    assert_lossless(demo_stack, demo_dspark_stack)
    counts = spec_counters(demo_dspark_stack.base_url)
    accepted, proposed = counts.accepted, counts.proposed
    assert accepted[0] > 0
    # With strict tools the grammar forces the call's structure; the trained draft proposes
    # much of it, which vLLM's count of accepted proposals includes and the drafted count not.
    assert proposed[0] >= accepted[0] and sum(proposed) > sum(accepted)


def test_the_chained_mtp_block_is_accepted_seven_deep_and_changes_no_token(
        demo_stack, demo_mtp_stack) -> None:
    assert_lossless(demo_stack, demo_mtp_stack)
    proposed = spec_counters(demo_mtp_stack.base_url).proposed
    assert len(proposed) == 7 and proposed[6] > 0


def assert_lossless(reference_stack: RunningStack, speculating: RunningStack) -> None:
    for mode in MODES:
        reference = answers(reference_stack, mode)
        assert any(calls for _, _, calls in reference), reference
        assert answers(speculating, mode) == reference
