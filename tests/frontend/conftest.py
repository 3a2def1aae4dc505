"""The gateway under test against a fake scheduler: one harness per test module."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.frontend.fake_scheduler import FakeScheduler, GatewayHarness


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[GatewayHarness]:
    module = request.module.__name__.rsplit(".", 1)[-1]
    h = GatewayHarness(Path(tmp_path_factory.mktemp(module)) / "model")
    yield h
    h.close()


@pytest.fixture(scope="module")
def http(harness: GatewayHarness) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=harness.base_url, timeout=30) as c:
        yield c


@pytest.fixture
def fake(harness: GatewayHarness) -> FakeScheduler:
    """The fake scheduler, its script and records reset for this test."""
    harness.fake.reset()
    return harness.fake
