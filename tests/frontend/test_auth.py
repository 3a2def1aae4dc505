"""`--api-key`: every route but the exempt ones needs `Authorization: Bearer <key>`; without it, or
with a wrong key, the OpenAI client sees a 401 AuthenticationError (an OpenAI error body)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from tests.frontend.fake_scheduler import SERVED_MODEL, GatewayHarness

KEY = "sk-test-0123456789"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayHarness]:
    harness = GatewayHarness(Path(tmp_path_factory.mktemp("keyed")) / "model", api_key=KEY)
    yield harness
    harness.close()


def client(harness: GatewayHarness, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=harness.base_url + "/v1", api_key=api_key, max_retries=0)


@pytest.mark.parametrize("api_key", ["sk-wrong", KEY + "x", KEY[:-1]])
def test_wrong_key_is_a_401(keyed, api_key):
    with pytest.raises(openai.AuthenticationError) as raised:
        client(keyed, api_key).chat.completions.create(model=SERVED_MODEL, messages=USER)
    assert raised.value.status_code == 401
    assert raised.value.body["code"] == "invalid_api_key"


def test_missing_key_is_a_401(keyed):
    with pytest.raises(openai.AuthenticationError):
        client(keyed, "unused").chat.completions.create(
            model=SERVED_MODEL, messages=USER, extra_headers={"Authorization": openai.Omit()})


def test_the_right_key_is_served(keyed):
    completion = client(keyed, KEY).chat.completions.create(model=SERVED_MODEL, messages=USER,
                                                            max_tokens=8)
    assert completion.choices[0].message.content


def test_every_other_route_needs_the_key(keyed):
    with httpx.Client(base_url=keyed.base_url) as http:
        for method, path in (("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/v1/models"),
                             ("GET", "/openapi.json"), ("POST", "/v1/completions")):
            response = http.request(method, path, json={})
            assert response.status_code == 401, path
            assert response.headers["www-authenticate"] == "Bearer"
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_health_and_metrics_are_exempt_by_default(keyed):
    with httpx.Client(base_url=keyed.base_url) as http:
        assert http.get("/health").status_code == 200
        assert http.get("/metrics").status_code == 200


def test_exempt_paths_are_configurable(tmp_path):
    harness = GatewayHarness(tmp_path / "model", api_key=KEY, auth_exempt_paths=("/v1/models",))
    try:
        with httpx.Client(base_url=harness.base_url) as http:
            assert http.get("/v1/models").status_code == 200
            assert http.get("/health").status_code == 401
    finally:
        harness.close()
