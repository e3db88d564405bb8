"""Schema fuzzing (schemathesis, stateless) of the gateway and every service, from each
one's committed OpenAPI (``proto/openapi/*.json``), against real uvicorn processes.

For every generated request, valid (``positive``) and invalid (``negative``): no 5xx, and
every error answer is the one envelope with a ``code``. Bounded: ``MAX_EXAMPLES`` per
mode and service keeps each service's run well under a minute on a 2-core machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
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
