"""The whole stack starts from one command and serves the OpenAI basics."""
from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow


def test_health_is_ok_once_the_stack_is_ready(http: httpx.Client) -> None:
    response = http.get("/health")
    assert response.status_code == 200, response.text


def test_models_lists_the_served_name(http: httpx.Client, stack) -> None:
    response = http.get("/v1/models")
    assert response.status_code == 200, response.text
    ids = [model["id"] for model in response.json()["data"]]
    assert ids == [stack.served_model_name]
