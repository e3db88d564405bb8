"""Limits, Unicode, nesting and content types: refused before any work, in the one envelope,
with the field named and a code; the keep-alive connection stays usable after each refusal.

Real uvicorn services (``arbiter serve``): the shared gateway and verify, plus a gateway
with small body and character limits so the limits are cheap to reach.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from arbiter.proto.errors import ErrorResponse
from tests.conftest import start_service

SMALL_BODY = 64 * 1024
SMALL_CHARS = 20_000


def _deep(depth: int) -> dict[str, object]:
    value: dict[str, object] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _score(groups: list[dict[str, object]], recipe: object = "gsm8k") -> bytes:
    return json.dumps({"recipe": recipe, "groups": groups}).encode()


OK: dict[str, object] = {
    "id": "q",
    "reference": "4",
    "responses": ["<think>2+2</think><answer>4</answer>"],
}

# (body, content type, status, code, param): one refusal each, past a limit or malformed.
GATEWAY_CASES = [
    # a response one character past MAX_TEXT_CHARS: the response itself is named
    (_score([OK, {"reference": "1", "responses": ["a", "x" * 100_001]}]), None, 422,
     "text_too_long", "groups.1.responses.1"),
    # a prompt past the same bound
    (_score([{"prompt": "p" * 100_001, "responses": ["a"]}]), None, 422, "text_too_long",
     "groups.0.prompt"),
    # 257 responses in one group
    (_score([{"responses": ["a"] * 257}]), None, 422, "list_too_long", "groups.0.responses"),
    # 1,025 groups
    (_score([{"responses": ["a"]}] * 1025), None, 422, "list_too_long", "groups"),
    # a lone surrogate in a response: 500 at cache_keys before
    (b'{"recipe":"gsm8k","groups":[{"responses":["ok","x\\ud800y"]}]}', None, 422,
     "invalid_unicode", "groups.0.responses.1"),
    # a lone low surrogate in a group id
    (b'{"recipe":"gsm8k","groups":[{"id":"\\udfff","responses":["ok"]}]}', None, 422,
     "invalid_unicode", "groups.0.id"),
    # params nested 40 deep (bounded at 32): no RecursionError anywhere later
    (_score([OK], {"components": [{"name": "format", "params": _deep(40)}]}), None, 422,
     "too_deep", "recipe.components.0.params"),
    # 10,000-deep JSON: the parser gives up; a 400 with a code, not code null
    (b"[" * 10_000 + b"]" * 10_000, None, 400, "invalid_json", None),
    # bytes that are not UTF-8
    (b'{"recipe": "\xff\xfe"}', None, 400, "invalid_json", None),
    # JSON syntax
    (b'{"recipe": ', None, 400, "invalid_json", None),
    # not JSON at all by its content type (curl -d sends form encoding)
    (_score([OK]), "application/x-www-form-urlencoded", 415, "unsupported_media_type", None),
    (_score([OK]), "text/plain", 415, "unsupported_media_type", None),
    # weights that overflow a sum: refused at recipe validation ("rewards":[Infinity] before)
    (_score([OK], {"components": [{"name": "format", "weight": 1e308},
                                  {"name": "math_accuracy", "weight": 1e308}]}),
     None, 422, "validation_error", "recipe.components.0.weight"),
]  # fmt: skip


def _post(
    conn: http.client.HTTPConnection, path: str, body: bytes, ctype: str | None
) -> tuple[int, bytes]:
    conn.request("POST", path, body=body, headers={"content-type": ctype or "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def _conn(url: str) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)


@pytest.mark.parametrize(("body", "ctype", "status", "code", "param"), GATEWAY_CASES)
def test_gateway_refuses_and_keeps_the_connection(
    gateway_url: str, body: bytes, ctype: str | None, status: int, code: str, param: str | None
) -> None:
    conn = _conn(gateway_url)
    got, content = _post(conn, "/v1/score", body, ctype)
    assert got == status, content[:300]
    err = ErrorResponse.model_validate_json(content).error
    assert (err.code, err.param) == (code, param), err
    sock = conn.sock
    # The same keep-alive connection serves the next request (a 500 used to close it).
    got, content = _post(conn, "/v1/score", _score([OK]), None)
    assert got == 200, content[:300]
    assert conn.sock is sock and sock is not None
    assert json.loads(content)["groups"][0]["rewards"][0] is not None
    conn.close()


def test_a_valid_surrogate_pair_is_accepted(gateway_url: str) -> None:
    # "\ud83d\ude00" is one character (U+1F600) spelled as a pair: valid Unicode
    body = b'{"recipe":"gsm8k","groups":[{"reference":"4","responses":["\\ud83d\\ude00 4"]}]}'
    r = httpx.post(f"{gateway_url}/v1/score", content=body,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        # lone surrogate: 500 in serialisation before
        (b'{"groups":[{"reference":"1","responses":["\\ud800"]}],"params":{}}',
         "invalid_unicode", "groups.0.responses.0"),
        # the per-response bound holds at the component too
        (json.dumps({"groups": [{"responses": ["1" * 100_001]}], "params": {}}).encode(),
         "text_too_long", "groups.0.responses.0"),
    ],
)  # fmt: skip
def test_verify_refuses_before_work(verify_url: str, body: bytes, code: str, param: str) -> None:
    r = httpx.post(f"{verify_url}/v1/math", content=body,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param)


@pytest.fixture(scope="module")
def small_gateway(log_dir: Path, verify_url: str) -> Iterator[str]:
    """A gateway whose body and character limits are small enough to reach cheaply."""
    proc, url = start_service("gateway", log_dir, {
        "GATEWAY_VERIFY_URL": verify_url,
        "GATEWAY_MAX_BODY_BYTES": str(SMALL_BODY),
        "GATEWAY_MAX_TOTAL_CHARS": str(SMALL_CHARS),
    })  # fmt: skip
    yield url
    proc.stop()


def test_body_past_the_limit_by_content_length(small_gateway: str) -> None:
    body = _score([{"responses": ["x" * 30_000]}] * 3)  # ~90 KB
    r = httpx.post(f"{small_gateway}/v1/score", content=body,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "body_too_large" and "GATEWAY_MAX_BODY_BYTES" in err["message"]


def test_chunked_body_is_counted_while_read(small_gateway: str) -> None:
    # No Content-Length: the body streams in; refused once the count passes the limit.
    def chunks() -> Iterator[bytes]:
        yield b'{"recipe":"gsm8k","groups":[{"responses":["'
        for _ in range(200):
            yield b"x" * 1024
        yield b'"]}]}'

    r = httpx.post(f"{small_gateway}/v1/score", content=chunks(),
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "body_too_large"


def test_total_characters_name_the_text_that_crossed(small_gateway: str) -> None:
    # 3 groups of 4 responses of 2,000 characters: the 11th response passes 20,000.
    groups = [{"id": f"g{i}", "responses": ["y" * 2000] * 4} for i in range(3)]
    r = httpx.post(f"{small_gateway}/v1/score", json={"recipe": "gsm8k", "groups": groups})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("too_many_chars", "groups.2.responses.2")
    # just under the bound is scored
    r = httpx.post(f"{small_gateway}/v1/score", json={"recipe": "gsm8k", "groups": groups[:2]})
    assert r.status_code == 200, r.text


def test_not_found_and_wrong_method_have_codes(verify_url: str) -> None:
    assert httpx.get(f"{verify_url}/v1/nowhere").json()["error"]["code"] == "not_found"
    r = httpx.get(f"{verify_url}/v1/math")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


@pytest.fixture(scope="module")
def tight_gateway(log_dir: Path, verify_url: str) -> Iterator[str]:
    """Room for one 64 KiB body at a time, across all requests."""
    proc, url = start_service("gateway", log_dir, {
        "GATEWAY_VERIFY_URL": verify_url,
        "GATEWAY_MAX_BODY_BYTES": str(SMALL_BODY),
        "GATEWAY_MAX_BUFFERED_BYTES": str(SMALL_BODY),
    })  # fmt: skip
    yield url
    proc.stop()


def test_bodies_in_progress_share_one_budget(tight_gateway: str) -> None:
    # A client sends half a body and stalls: the budget holds its bytes. A second body
    # that would take the total past the budget is refused at once, retryable; once the
    # first is done the second goes through.
    parts = urlsplit(tight_gateway)
    stalled = socket.create_connection((parts.hostname or "", parts.port or 0))
    body = _score([{"reference": "1", "responses": ["1" * 40_000]}])
    head = (f"POST /v1/score HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    stalled.sendall(head + body[:40_000])
    time.sleep(0.5)
    r = httpx.post(f"{tight_gateway}/v1/score", content=body,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "too_busy" and r.headers["retry-after"] == "1"
    stalled.sendall(body[40_000:])
    assert stalled.recv(64).startswith(b"HTTP/1.1 200")
    stalled.close()
    r = httpx.post(f"{tight_gateway}/v1/score", content=body,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # NeMo Gym's extra fields ride along and are echoed back: 300 deep was a 500
        ("/v1/compat/nemo-gym/gsm8k/verify",
         {"responses_create_params": {"input": "q"}, "response": {"output": []},
          "extra": _deep(300)}),
        # slime's label is free-form JSON
        ("/v1/compat/slime/gsm8k", {"prompt": "p", "response": "r", "label": _deep(40)}),
    ],
)  # fmt: skip
def test_compat_payloads_are_bounded_in_depth(
    gateway_url: str, path: str, body: dict[str, object]
) -> None:
    r = httpx.post(f"{gateway_url}{path}", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "too_deep"
