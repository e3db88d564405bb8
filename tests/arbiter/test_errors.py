"""The one failure vocabulary: statuses, kinds and retryability, the envelope round trip,
and the client raising the shared classes on a real service's answers."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import httpx
import pytest

from arbiter.client import ArbiterClient
from arbiter.errors import (
    ArbiterError,
    BadRequest,
    BadResponse,
    InvalidRequest,
    ItemFailure,
    ItemResult,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    Timeout,
    Unavailable,
    Unprocessable,
    from_response,
    from_status,
    is_retryable_status,
    item_error,
    to_envelope,
)
from arbiter.proto.errors import RETRYABLE_KINDS, ErrorResponse

CLASSES = [
    # (class, status, envelope type, item kind, retryable): why
    (ArbiterError, 500, "internal_error", "internal", False),  # a bug: same input, same bug
    (BadRequest, 400, "invalid_request_error", "bad_response", False),  # input must change
    (Unprocessable, 422, "invalid_request_error", "bad_response", False),  # body must change
    (PayloadTooLarge, 413, "payload_too_large", "bad_response", False),  # must be split
    (NotFound, 404, "not_found", "bad_response", False),  # no such recipe/route appears by itself
    (RateLimited, 429, "rate_limited", "unavailable", True),  # the quota refills: wait, retry
    (Unavailable, 503, "unavailable", "unavailable", True),  # a service restarting comes back
    (Timeout, 504, "timeout", "timeout", True),  # a busy moment passes
    (BadResponse, 502, "internal_error", "bad_response", False),  # same request, same bad body
]


@pytest.mark.parametrize(("cls", "status", "type_", "kind", "retryable"), CLASSES)
def test_each_error_knows_status_type_kind_and_retryable(
    cls: type[ArbiterError], status: int, type_: str, kind: str, retryable: bool
) -> None:
    err = cls("boom", param="groups.0", code="why")
    assert (err.status, err.type, err.kind, err.retryable) == (status, type_, kind, retryable)
    assert err.retryable == (kind in RETRYABLE_KINDS)
    assert to_envelope(err) == (status, err.envelope())


ANSWERS = [
    # (status, body, class, kind, retryable): why
    (400, b"", BadRequest, "bad_response", False),  # empty body: the status alone decides
    (422, b"{}", Unprocessable, "bad_response", False),  # not our envelope: status decides
    (405, b"", InvalidRequest, "bad_response", False),  # any other 4xx is the request's fault
    (429, b"", RateLimited, "unavailable", True),  # overloaded: back off and retry
    (500, b"oops", Unavailable, "unavailable", True),  # a callee's crash is an outage to us
    (502, b"<html>bad gateway</html>", Unavailable, "unavailable", True),  # a proxy's upstream
    (503, b"", Unavailable, "unavailable", True),  # down or restarting
    (504, b"", Timeout, "timeout", True),  # past a deadline somewhere behind
]


@pytest.mark.parametrize(("status", "body", "cls", "kind", "retryable"), ANSWERS)
def test_answers_are_classified_by_status(
    status: int, body: bytes, cls: type[ArbiterError], kind: str, retryable: bool
) -> None:
    err = from_response(status, body, source="svc")
    assert type(err) is cls and err.status == status
    assert (err.kind, err.retryable, is_retryable_status(status)) == (kind, retryable, retryable)
    assert str(err).startswith(f"HTTP {status} from svc: ")


def test_envelope_round_trip() -> None:
    # what a service answers is what its caller rebuilds: class, type, param, code, message
    sent = PayloadTooLarge("300 responses; the limit is 256", param="groups", code="too_many")
    status, envelope = to_envelope(sent)
    got = from_response(status, envelope.model_dump_json())
    assert type(got) is PayloadTooLarge and got.status == 413
    assert (got.type, got.param, got.code) == ("payload_too_large", "groups", "too_many")
    assert got.message == "HTTP 413: 300 responses; the limit is 256"
    assert ErrorResponse.model_validate(envelope.model_dump()) == sent.envelope()


def test_foreign_error_bodies_keep_their_message() -> None:
    # vLLM/OpenAI style {"error": {"message"}} and FastAPI's {"detail"}: the text survives
    openai = json.dumps({"error": {"message": "too long", "type": "BadRequestError", "code": 400}})
    assert str(from_response(400, openai)) == "HTTP 400: too long"
    assert str(from_response(404, '{"detail": "Not Found"}')) == "HTTP 404: Not Found"


def test_boundaries_for_plain_exceptions_and_statuses() -> None:
    # a bug anywhere is a 500 envelope / an "internal" item, with the exception's name
    status, envelope = to_envelope(KeyError("x"))
    assert status == 500 and envelope.error.type == "internal_error"
    assert envelope.error.message == "KeyError: 'x'"
    assert item_error(3, ValueError("bad")).model_dump() == {
        "index": 3, "kind": "internal", "message": "ValueError: bad"}  # fmt: skip
    # Starlette raises bare statuses (unknown route, wrong method)
    assert (from_status(405, "Method Not Allowed").status, from_status(404, "x").type) == (
        405,
        "not_found",
    )


def test_item_results_carry_the_failure_kind() -> None:
    failed = ItemResult.failed(ItemFailure("judge_parse_error", "no score"), prompt_tokens=7)
    assert (failed.score, failed.kind, failed.prompt_tokens) == (None, "judge_parse_error", 7)
    entry = failed.error(2)
    assert entry is not None and (entry.index, entry.kind) == (2, "judge_parse_error")
    assert ItemResult(1.0).error(0) is None
    assert pickle.loads(pickle.dumps(failed)) == failed  # verify's workers send them by pipe
    assert item_error(0, Timeout("slow")).kind == "timeout"


def test_importable_without_service_extras() -> None:
    # the client uses these classes: no web framework, Redis or torch behind them
    code = (
        "import sys, arbiter.errors\n"
        "heavy = {'fastapi', 'starlette', 'uvicorn', 'redis', 'torch', 'httpx'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_real_service_4xx_is_the_shared_class(verify_url: str) -> None:
    # a real verify service refuses a body with no groups: 422 naming the field
    r = httpx.post(f"{verify_url}/v1/math", json={"groups": [], "params": {}})
    err = from_response(r.status_code, r.content)
    assert isinstance(err, Unprocessable) and not err.retryable
    assert err.param == "groups" and err.code == "validation_error"


def test_client_raises_the_shared_class(gateway_url: str) -> None:
    client = ArbiterClient(gateway_url)
    try:
        with pytest.raises(InvalidRequest) as info:
            client.score([{"reference": "18", "responses": ["18"]}], "no-such-recipe")
    finally:
        client.close()
    err = info.value
    assert isinstance(err, ArbiterError) and not err.retryable and err.status in (404, 422)
    assert err.param == "recipe" and "no-such-recipe" in err.message
