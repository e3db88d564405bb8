"""A request the HTTP parser refuses is answered in the envelope, not uvicorn's plain text.

Raw sockets (no client library sends these bytes): the shared verify service as
``arbiter serve`` runs it (httptools), and uvicorn serving a trivial app in this process
with the h11 protocol class (the one uvicorn falls back to without httptools).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from arbiter.procs import free_port
from arbiter.proto.errors import ErrorResponse
from arbiter.services.common.protocol import EnvelopeH11Protocol

CASES = [
    # a NUL byte in a header value (uvicorn's plain-text 400 once)
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Tag: a\x00b\r\n\r\n",
    # a DEL byte in a header value
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Tag: a\x7fb\r\n\r\n",
    # a control character in a header name
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX\x01Tag: ab\r\n\r\n",
    # a NUL byte in the target
    b"GET /heal\x00thz HTTP/1.1\r\nHost: x\r\n\r\n",
    # not a request line at all
    b"GARBAGE\r\n\r\n",
]


def _exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _check(answer: bytes) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 400 Bad Request", answer[:200]
    headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
    assert headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(body)
    err = ErrorResponse.model_validate_json(body).error
    assert (err.type, err.code) == ("invalid_request_error", "invalid_http")


@pytest.mark.parametrize("request_bytes", CASES)
def test_service_answers_unparsable_requests_in_the_envelope(
    verify_url: str, request_bytes: bytes
) -> None:
    _check(_exchange(int(verify_url.rsplit(":", 1)[1]), request_bytes))


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def h11_port() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, http=EnvelopeH11Protocol,
                            lifespan="off", log_level="error")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started
    yield port
    server.should_exit = True
    thread.join(10)


# h11 lets a DEL byte in a header value through (the request is served as usual)
@pytest.mark.parametrize("request_bytes", [c for c in CASES if b"\x7f" not in c])
def test_h11_answers_unparsable_requests_in_the_envelope(
    h11_port: int, request_bytes: bytes
) -> None:
    _check(_exchange(h11_port, request_bytes))


def test_a_valid_request_is_untouched(h11_port: int) -> None:
    # a tab inside a header value is allowed (obs-text/HTAB): served normally
    answer = _exchange(
        h11_port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Tag: a\tb\r\nConnection: close\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 200") and b"ok" in answer


def test_malformed_requests_in_a_loop_log_one_warning(
    h11_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    # uvicorn logs "Invalid HTTP request received." per malformed request: a client
    # sending them in a loop would flood the log. One line per 10 s, with a count.
    with caplog.at_level(logging.WARNING, logger="uvicorn.error"):
        for _ in range(20):
            _check(_exchange(h11_port, CASES[0]))
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.error"]
    assert sum(m.startswith("Invalid HTTP request") for m in lines) <= 1, lines
