"""Schemathesis fuzzes the gateway from its own /openapi.json: valid and invalid bodies for every
route in the document, and no answer is ever a 5xx.

The gateway under test is the real app (uvicorn, real tokenizer, pydantic models, constraint
builder) in front of the in-process fake scheduler: the gateway is what parses client input, and
the fake admits and streams like the real scheduler in milliseconds, so a few hundred examples run
in seconds on a 2-core CI machine (the inputs the real scheduler refuses are in tests/e2e). The
examples are derandomized: CI runs the same ones every time.
"""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.frontend.fake_scheduler import GatewayHarness

EXAMPLES_PER_ROUTE = 25
MODES = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]


@pytest.fixture(scope="module")
def served_schema(harness: GatewayHarness) -> schemathesis.BaseSchema:
    """The document the gateway serves, loaded over HTTP as any client would."""
    return schemathesis.openapi.from_url(f"{harness.base_url}/openapi.json")


def test_openapi_document_lists_the_typed_routes(http):
    document = http.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    assert {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"} <= \
        set(document["paths"])
    max_tokens = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]["max_tokens"]
    assert max_tokens["anyOf"][0]["maximum"] == 2**31 - 1


@pytest.mark.parametrize("mode", MODES, ids=[mode.value for mode in MODES])
def test_no_generated_request_gets_a_server_error(harness, served_schema, mode):
    statuses: dict[str, list[int]] = {}
    for result in served_schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() != "POST":   # GET /v1/models takes no input to vary
            continue

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_ROUTE, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def call(case: schemathesis.Case) -> None:
            response = case.call(base_url=harness.base_url, timeout=60)
            statuses.setdefault(operation.label, []).append(response.status_code)
            assert response.status_code < 500, (operation.label, response.status_code,
                                                response.text[:500])

        call()
    assert set(statuses) == {"POST /v1/chat/completions", "POST /v1/completions",
                             "POST /tokenize", "POST /detokenize"}
    assert all(len(codes) >= 10 for codes in statuses.values()), \
        {label: len(codes) for label, codes in statuses.items()}
