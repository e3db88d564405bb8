"""The scoring core's component client (aiohttp) against real sockets.

The raw servers stand in for behaviours uvicorn does not produce on demand (a component
that closes every connection after answering, one that never answers, one that does not
speak HTTP); every other gateway test runs the same client against real uvicorn services.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from arbiter.errors import Timeout, Unavailable
from arbiter.procs import free_port
from arbiter.proto.components import ComponentResponse
from arbiter.services.scoring.fanout import ComponentClient
from arbiter.services.scoring.recipes import COMPONENTS
from arbiter.services.scoring.settings import ComponentSettings
from tests.services.gateway.conftest import RawServer, http_reply

FORMAT = COMPONENTS["format"]
BODY = b'{"groups":[{"id":"g","responses":["x"]}],"params":{}}'
OK = http_reply("200 OK", b'{"component":"format","groups":[{"id":"g","scores":[1.0]}]}')


@asynccontextmanager
async def client(url: str, **settings: object) -> AsyncIterator[ComponentClient]:
    c = ComponentClient(ComponentSettings(service_urls={"verify": url}, **settings))
    try:
        yield c
    finally:
        await c.close()


async def test_keep_alive_connection_is_reused() -> None:
    server = RawServer(OK)
    try:
        async with client(server.url) as c:
            for _ in range(4):  # sequential: one connection serves them all
                assert isinstance(await c.call(FORMAT, BODY), ComponentResponse)
        assert server.accepted == 1
    finally:
        server.close()


async def test_component_closing_every_connection_still_answers() -> None:
    # The server closes after each reply without saying so (as a restarting component
    # does): the next call must not fail on the dead pooled connection.
    server = RawServer(OK, close_after=True)
    try:
        async with client(server.url) as c:
            for _ in range(4):
                got = await c.call(FORMAT, BODY)
                assert isinstance(got, ComponentResponse), got
        assert server.accepted == 4
    finally:
        server.close()


async def test_concurrent_calls_are_bounded_and_each_gets_its_answer() -> None:
    server = RawServer(OK)
    try:
        async with client(server.url, max_concurrency=8) as c:
            got = await asyncio.gather(*(c.call(FORMAT, BODY) for _ in range(40)))
        assert all(isinstance(r, ComponentResponse) for r in got)
        assert server.accepted <= 8  # GATEWAY_MAX_CONCURRENCY per service
    finally:
        server.close()


async def test_transport_failures_are_values_with_their_kind(hung_server: RawServer) -> None:
    # accepts, never answers: past the component's deadline
    async with client(hung_server.url, component_timeouts={"format": 0.3}) as c:
        got = await c.call(FORMAT, BODY)
        assert isinstance(got, Timeout) and got.kind == "timeout"
    # nothing listens
    async with client(f"http://127.0.0.1:{free_port()}") as c:
        got = await c.call(FORMAT, BODY)
        assert isinstance(got, Unavailable) and got.kind == "unavailable"
    # answers, but not HTTP
    garbage = RawServer(b"NOT HTTP AT ALL\r\n\r\n")
    try:
        async with client(garbage.url) as c:
            got = await c.call(FORMAT, BODY)
            assert isinstance(got, Unavailable), got
    finally:
        garbage.close()
