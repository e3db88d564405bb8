"""The gateway's lean HTTP/1.1 transport under httpx, against real sockets.

The raw servers stand in for HTTP framings uvicorn does not produce on demand (chunked
bodies, close-delimited bodies, a server dropping keep-alive connections); the same
transport against real uvicorn services is what every other gateway test exercises.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from arbiter.procs import free_port
from arbiter.services.gateway.transport import LeanTransport
from tests.services.gateway.conftest import RawServer

LIMITS = httpx.Limits(max_connections=8, max_keepalive_connections=8, keepalive_expiry=4.0)


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=LeanTransport(LIMITS), timeout=httpx.Timeout(10.0))


@pytest.mark.parametrize(
    ("reply", "close_after", "body"),
    [
        # content-length framing, keep-alive
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", False, b"hello"),
        # chunked framing with a chunk extension and a trailer
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
         b"5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n", False, b"hello world"),
        # no length: the body ends when the server closes
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil-eof", True, b"until-eof"),
        # the server closes after each reply without saying so: the next request finds the
        # pooled connection dead and retries once on a fresh one
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", True, b"ok"),
    ],
)  # fmt: skip
async def test_framings_and_reuse(reply: bytes, close_after: bool, body: bytes) -> None:
    server = RawServer(reply, close_after=close_after)
    try:
        async with client() as c:
            for _ in range(4):  # sequential: exercises connection reuse
                r = await c.post(f"{server.url}/v1/x", content=b'{"a": 1}')
                assert r.status_code == 200 and r.content == body
        assert server.accepted == (4 if close_after else 1)
    finally:
        server.close()


async def test_concurrent_requests_each_get_their_answer() -> None:
    server = RawServer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    try:
        async with client() as c:
            rs = await asyncio.gather(*(c.post(f"{server.url}/", content=b"x") for _ in range(40)))
        assert all(r.content == b"ok" for r in rs)
        assert server.accepted <= 8  # bounded by max_connections
    finally:
        server.close()


async def test_errors_are_httpx_errors(hung_server: RawServer) -> None:
    async with client() as c:
        with pytest.raises(httpx.ReadTimeout):  # accepts, never answers
            await c.post(f"{hung_server.url}/", content=b"x", timeout=0.3)
        with pytest.raises(httpx.ConnectError):  # nothing listens
            await c.post(f"http://127.0.0.1:{free_port()}/", content=b"x")
        garbage = RawServer(b"NOT HTTP AT ALL\r\n\r\n")
        try:
            with pytest.raises(httpx.RemoteProtocolError):
                await c.post(f"{garbage.url}/", content=b"x")
        finally:
            garbage.close()
