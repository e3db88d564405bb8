"""Every service answers errors in the one envelope, whatever went wrong (real uvicorn)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from arbiter.proto.errors import ErrorResponse
from arbiter.services.common.app import create_service_app
from tests.services.common.hostile import MAX_ERROR_BYTES, MB, check_hostile_bodies

CASES = [
    # (method, path, body, status, type, code): a comment per case
    ("POST", "/v1/math", b"{not json", 400, "invalid_request_error", "invalid_json"),  # bad JSON
    ("POST", "/v1/math", b"[]", 422, "invalid_request_error", "validation_error"),  # not an object
    ("GET", "/v1/nowhere", None, 404, "not_found", None),  # unknown route
    ("GET", "/v1/math", None, 405, "invalid_request_error", None),  # wrong method
]


@pytest.mark.parametrize(("method", "path", "body", "status", "type_", "code"), CASES)
def test_verify_errors_use_the_envelope(
    verify_url: str,
    method: str,
    path: str,
    body: bytes | None,
    status: int,
    type_: str,
    code: str | None,
) -> None:
    r = httpx.request(method, verify_url + path, content=body,
                      headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == status, r.text
    err = ErrorResponse.model_validate_json(r.content).error
    assert err.type == type_ and err.message
    if code is not None:
        assert err.code == code


def test_gateway_missing_field_is_named(gateway_url: str) -> None:
    r = httpx.post(f"{gateway_url}/v1/score", json={"recipe": "gsm8k", "groups": [{"id": "x"}]})
    assert r.status_code == 422
    err = ErrorResponse.model_validate_json(r.content).error
    assert err.param == "groups.0.responses"


MATH_BODY = {"groups": [{"reference": "4", "responses": ["<answer>4</answer>"]}], "params": {}}
SCORE_BODY = {"recipe": "gsm8k", "groups": [{"id": "q", "reference": "4", "responses": ["4"]}]}


@pytest.mark.parametrize("path", ["/v1/math", "/v1/format"])
def test_verify_hostile_keys_are_422_and_short(verify_url: str, path: str) -> None:
    # A lone surrogate in an object key: a 500 once; a 1 MB key:
    # echoed whole before.
    check_hostile_bodies(verify_url, path, MATH_BODY, "params")


def test_gateway_hostile_keys_are_422_and_short(gateway_url: str) -> None:
    inline = {"components": [{"name": "format", "weight": 1.0, "params": {}}]}
    check_hostile_bodies(gateway_url, "/v1/score", {**SCORE_BODY, "recipe": inline}, "recipe")


def test_gateway_nemo_gym_hostile_keys_are_422(gateway_url: str) -> None:
    # NeMo Gym's request carries free-form objects (extra fields allowed): the surrogate
    # key is refused all the same.
    body = {"responses_create_params": {"input": "What is 2 + 2?"},
            "response": {"output": []}, "expected_answer": "4"}  # fmt: skip
    url = "/v1/compat/nemo-gym/gsm8k/verify"
    check_hostile_bodies(gateway_url, url, body, "responses_create_params", long_key=False)


def test_megabyte_values_are_not_echoed(gateway_url: str) -> None:
    # A 1 MB recipe name came back in a 1 MB 422 once: the answer says what
    # is wrong in a few hundred bytes.
    r = httpx.post(f"{gateway_url}/v1/score", json={**SCORE_BODY, "recipe": "r" * MB})
    assert 400 <= r.status_code < 500, r.text[:300]
    assert len(r.content) < MAX_ERROR_BYTES, len(r.content)
    assert ErrorResponse.model_validate_json(r.content).error.message


def test_a_bug_answers_its_type_only_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    # A route that raises: a bug cannot be caused on demand in a real service, so a tiny
    # app built by the same factory stands in. The exception's text names internals (a
    # Redis address and command); the caller gets its type, the log gets one line per
    # 10 s however many requests hit it.
    router = APIRouter()

    @router.post("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("HINCRBY usage:teams at redis://10.0.0.7:6379 failed")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield

    async def ready(_: FastAPI) -> dict[str, str]:
        raise ConnectionError("redis://10.0.0.7:6379 refused")

    app = create_service_app(service="t", title="t", router=router, lifespan=lifespan,
                             ready=ready)  # fmt: skip
    with (
        caplog.at_level(logging.ERROR, logger="arbiter"),
        TestClient(app, raise_server_exceptions=False) as client,
    ):
        answers = [client.post("/v1/boom", json={}) for _ in range(20)]
        readiness = client.get("/readyz")
    for r in answers:
        assert r.status_code == 500
        err = ErrorResponse.model_validate_json(r.content).error
        assert "RuntimeError" in err.message and "redis" not in err.message.lower()
    assert readiness.status_code == 503 and "10.0.0.7" not in readiness.text
    assert [r.getMessage() for r in caplog.records].count("unhandled error") == 1
