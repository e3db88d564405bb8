"""Every service answers errors in the one envelope, whatever went wrong (real uvicorn)."""

from __future__ import annotations

import httpx
import pytest

from arbiter.proto.errors import ErrorResponse

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
