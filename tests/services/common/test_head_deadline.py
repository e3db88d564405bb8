"""A connection must send a complete request head within ``HEAD_TIMEOUT_S``, or be closed.

uvicorn has no such deadline: a connection that sends nothing, or a head a byte at a time,
was held for as long as the client liked (a hostile review: 19,980 such connections without
a key filled the gateway's 20,000 file descriptors in 5 s and every team's request failed
until the client let go). Raw sockets against uvicorn serving a small app in this process
with each of Arbiter's protocol classes (httptools, as ``arbiter serve`` runs, and h11),
the deadline shortened so that the test waits half a second, not ten.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from arbiter.procs import free_port
from arbiter.services.common import protocol

HEAD_S = 0.5
SLOW_S = 3 * HEAD_S  # an app that takes longer than the head deadline


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(SLOW_S)
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


_CLASSES: dict[str, type[asyncio.Protocol]] = {
    "h11": protocol.EnvelopeH11Protocol,
    "httptools": protocol.HTTPProtocol,
}


@pytest.fixture(scope="module", params=sorted(_CLASSES))
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(protocol, "HEAD_TIMEOUT_S", HEAD_S)
        port = free_port()
        config = uvicorn.Config(_app, host="127.0.0.1", port=port, http=_CLASSES[request.param],
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


def _closed(sock: socket.socket, drip: bytes = b"", bound_s: float = 20 * HEAD_S) -> bytes:
    """Read until the server closes the connection (dripping ``drip`` a byte at a time
    meanwhile); what it sent. Fails if it is still open after ``bound_s``."""
    sock.settimeout(HEAD_S / 5)
    data = b""
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if drip:
                sock.sendall(drip[:1])
                drip = drip[1:] or drip  # the last byte again and again
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"still open after {bound_s} s (got {data[:100]!r})")


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    with _connect(port) as sock:
        assert _closed(sock) == b""


def test_a_head_sent_a_byte_at_a_time_is_closed(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n")
        assert _closed(sock, drip=b"X-Slow: aaaaaaaa") == b""


def test_a_kept_alive_connection_dripping_its_next_head_is_closed(port: int) -> None:
    # a keep-alive connection's idle timer is cancelled by any byte: the next head has
    # its deadline too
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b"ok") and (chunk := sock.recv(65536)):
            first += chunk
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET / HTTP/1.1\r\n")
        assert _closed(sock, drip=b"X-Slow: aaaaaaaa") == b""


def test_a_request_slower_than_the_head_deadline_is_answered(port: int) -> None:
    # the deadline is the head's: a request being served is never cut by it, nor one
    # pipelined behind it
    with _connect(port) as sock:
        sock.sendall(
            b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        data = _closed(sock, bound_s=4 * SLOW_S + 10)
    assert data.count(b"HTTP/1.1 200") == 2, data
