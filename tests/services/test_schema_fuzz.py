"""Schema fuzzing (schemathesis, stateless) of the gateway and every service, from each
one's committed OpenAPI (``proto/openapi/*.json``), against real uvicorn processes.

For every generated request, valid (``positive``) and invalid (``negative``): no 5xx, and
every error answer is the one envelope with a ``code``. Bounded: ``MAX_EXAMPLES`` per
mode and service keeps each service's run well under a minute on a 2-core machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.transport import Response

from arbiter.openapi import OPENAPI_DIR
from arbiter.procs import free_port
from arbiter.proto.common import Readiness
from arbiter.proto.errors import ErrorResponse
from tests.conftest import start_service
from tests.services.embedding.conftest import wait_ready

MAX_EXAMPLES = 150


@pytest.fixture(scope="module")
def embedding_fuzz_url(log_dir: Path) -> Iterator[str]:
    proc, url = start_service("embedding", log_dir, {
        "EMBEDDING_DEVICE": "cpu", "EMBEDDING_MAX_INPUTS": "64",
    })  # fmt: skip
    try:
        wait_ready(url)
        yield url
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def judge_fuzz_url(log_dir: Path) -> Iterator[str]:
    # A judge whose model server is not there: every item is null + unavailable at once
    # (no retries), which is the judge's answer to fuzzing without a GPU.
    proc, url = start_service("judge", log_dir, {
        "JUDGE_BASE_URL": f"http://127.0.0.1:{free_port()}/v1", "JUDGE_MODEL": "none",
        "JUDGE_MAX_RETRIES": "0",
    })  # fmt: skip
    yield url
    proc.stop()


def _check(response: Response, where: str) -> None:
    if where == "GET /readyz" and response.status_code == 503:
        Readiness.model_validate_json(response.content)  # not ready: documented, not an error
        return
    assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:500]}"
    if response.status_code >= 400:
        err = ErrorResponse.model_validate_json(response.content).error
        assert err.code, f"{where}: an error without a code: {response.text[:500]}"


def _fuzz(service: str, url: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_path(OPENAPI_DIR / f"{service}.json")
    session = requests.Session()  # one keep-alive connection, as a real client

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=schema.as_strategy(mode))
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=url, session=session, timeout=30)
        _check(response, f"{case.method} {case.formatted_path}")

    run()


MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]


@pytest.mark.parametrize("mode", MODES)
def test_gateway(gateway_url: str, mode: GenerationMode) -> None:
    _fuzz("gateway", gateway_url, mode)


@pytest.mark.parametrize("mode", MODES)
def test_verify(verify_url: str, mode: GenerationMode) -> None:
    _fuzz("verify", verify_url, mode)


@pytest.mark.parametrize("mode", MODES)
def test_embedding(embedding_fuzz_url: str, mode: GenerationMode) -> None:
    _fuzz("embedding", embedding_fuzz_url, mode)


@pytest.mark.parametrize("mode", MODES)
def test_judge(judge_fuzz_url: str, mode: GenerationMode) -> None:
    _fuzz("judge", judge_fuzz_url, mode)


# Hostile JSON beyond the schemas: keys and strings from characters a client library never
# sends on its own (lone surrogates: one in a key was once a 500 on every service;
# NUL, DEL, line separators), some of them long (an error must not echo them back whole),
# merged into a valid body (at the top or in its params) or sent alone.
HOSTILE_EXAMPLES = 60
# 1,000 characters of message and 200 of param, each at most 6 bytes as JSON (\u0000)
MAX_ERROR_BYTES = 8 * 1024
_CHARS = st.sampled_from(["\ud800", "\udc00", "\udfff", "\x00", "\x7f", "\u2028", '"', "\\", "."])
_TEXT = st.text(_CHARS | st.characters(), max_size=8) | st.builds(
    lambda c, n: c * n, _CHARS | st.just("k"), st.integers(1_000, 200_000)
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_TEXT, kids, max_size=3),
    max_leaves=8,
)
_GROUPS = [{"id": "q", "prompt": "2 + 2?", "reference": "4", "responses": ["4", "x"]}]
HOSTILE_ROUTES: dict[str, dict[str, dict[str, Any]]] = {
    "gateway": {
        "/v1/score": {"recipe": {"components": [{"name": "format", "weight": 1.0, "params": {}}]},
                      "groups": _GROUPS},
        "/v1/compat/nemo-gym/gsm8k/verify": {"responses_create_params": {"input": "2 + 2?"},
                                             "response": {"output": []}, "params": {}},
    },
    "verify": {"/v1/math": {"groups": _GROUPS, "params": {}},
               "/v1/format": {"groups": _GROUPS, "params": {}}},
    "embedding": {"/v1/diversity": {"groups": _GROUPS, "params": {}},
                  "/v1/embeddings": {"model": "all-MiniLM-L6-v2", "input": ["a"], "params": {}}},
    "judge": {"/v1/quality": {"groups": _GROUPS, "params": {}},
              "/v1/verifier": {"groups": _GROUPS, "params": {}}},
}  # fmt: skip


def _hostile(service: str, url: str) -> None:
    routes = HOSTILE_ROUTES[service]
    session = requests.Session()

    @settings(
        max_examples=HOSTILE_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        path=st.sampled_from(sorted(routes)),
        extra=st.dictionaries(_TEXT, _JSON, min_size=1, max_size=3),
        where=st.sampled_from(["top", "params", "alone"]),
    )
    def run(path: str, extra: dict[str, Any], where: str) -> None:
        base = routes[path]
        if where == "alone":
            body: dict[str, Any] = extra
        elif where == "params":
            body = {**base, "params": {**base.get("params", {}), **extra}}
        else:
            body = {**base, **extra}
        data = json.dumps(body).encode()  # ensure_ascii: lone surrogates spelled \udXXX
        response = session.post(url + path, data=data, timeout=60,
                                headers={"content-type": "application/json"})  # fmt: skip
        where_ = f"POST {path} ({where})"
        assert response.status_code < 500, f"{where_}: {response.status_code} {response.text[:500]}"
        if response.status_code >= 400:
            err = ErrorResponse.model_validate_json(response.content).error
            assert err.code, f"{where_}: an error without a code: {response.text[:500]}"
            assert len(response.content) < MAX_ERROR_BYTES, f"{where_}: {len(response.content)}"

    run()


@pytest.mark.parametrize("service", ["gateway", "verify", "embedding", "judge"])
def test_hostile_json(request: pytest.FixtureRequest, service: str) -> None:
    fixture = {"embedding": "embedding_fuzz_url", "judge": "judge_fuzz_url"}
    _hostile(service, request.getfixturevalue(fixture.get(service, f"{service}_url")))
