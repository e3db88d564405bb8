"""The embedding bench's load generator: closed-loop clients spread over several processes.

One Python process driving 32 clients through httpx tops out at a few hundred requests/s
(its own CPU), far below what the service must answer on a GPU (~750 requests/s for
6,000 texts/s in groups of 8). So the clients are split over ``procs`` processes, each
with its own event loop (uvloop when installed) and its own keep-alive connections: still
``clients`` requests in flight in total, one per client. Each client sends its next request
as soon as the previous answer is in. Request bodies are serialised before the clock
starts, and every answer is parsed and checked (8 non-null scores). Each process reports
its CPU seconds so the bench can show the load generator is not the bottleneck.

The client speaks plain HTTP/1.1 over asyncio streams (keep-alive, Content-Length bodies,
which is what uvicorn answers with), the way wrk-style load generators do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any


class _Conn:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        """A fresh connection (the server drops idle ones after its keep-alive timeout)."""
        await self.close()
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            await self.connect()
        assert self.reader is not None and self.writer is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode("ascii") + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        data = await self.reader.readexactly(length)
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
            self.reader = self.writer = None


def _check(status: int, data: bytes, expect: int) -> None:
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {data[:300]!r}")
    scores = json.loads(data)["groups"][0]["scores"]
    if len(scores) != expect or None in scores:
        raise RuntimeError(f"bad answer: {data[:300]!r}")


async def _run_block(
    conns: list[_Conn], bodies: list[list[tuple[bytes, int]]]
) -> tuple[float, float]:
    """Each client sends its own bodies back to back; returns (wall s, cpu s)."""

    async def client(conn: _Conn, mine: list[tuple[bytes, int]]) -> None:
        for body, n in mine:
            status, data = await conn.post("/v1/diversity", body)
            _check(status, data, n)

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client(c, b) for c, b in zip(conns, bodies, strict=True)))
    return time.perf_counter() - t0, time.process_time() - cpu0


async def _connect_all(clients: list[_Conn]) -> None:
    await asyncio.gather(*(c.connect() for c in clients))


def _worker(conn: Connection, host: str, port: int, n_clients: int) -> None:
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    clients = [_Conn(host, port) for _ in range(n_clients)]
    try:
        while True:
            msg = conn.recv()  # one list of (body bytes, texts) per client of this process
            if msg is None:
                break
            # connect before the clock starts: the baseline's turn may outlast keep-alive
            loop.run_until_complete(_connect_all(clients))
            conn.send("loaded")
            conn.recv()  # go: the clock starts once every process holds its bodies
            try:
                conn.send(("ok", *loop.run_until_complete(_run_block(clients, msg))))
            except Exception as exc:  # report, keep serving (the parent raises)
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        for c in clients:
            loop.run_until_complete(c.close())
        loop.close()


@dataclass
class BlockResult:
    wall_s: float  # first request sent → last answer in, over all processes
    client_cpu_s: float  # CPU seconds of all load-generator processes together
    procs: int

    @property
    def client_cpu_per_proc(self) -> float:
        """Mean CPU utilisation of one load-generator process (1.0 = a core saturated)."""
        return self.client_cpu_s / self.procs / self.wall_s


class LoadGenerator:
    """``clients`` closed-loop clients over ``procs`` processes, reused across blocks."""

    def __init__(self, host: str, port: int, clients: int, procs: int):
        procs = max(1, min(procs, clients))
        ctx = mp.get_context("spawn")
        self.clients = clients
        self.split = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
        self._pipes: list[Connection] = []
        self._procs: list[Any] = []
        for n in self.split:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(child, host, port, n), daemon=True)
            p.start()
            child.close()
            self._pipes.append(parent)
            self._procs.append(p)

    def run(self, per_client: list[list[list[str]]]) -> BlockResult:
        """``per_client[c]`` = the groups client c sends, in order (one group per request)."""
        assert len(per_client) == self.clients
        bodies = [
            [
                (
                    json.dumps({"groups": [{"id": "g", "responses": g}], "params": {}}).encode(),
                    len(g),
                )
                for g in mine
            ]
            for mine in per_client
        ]
        first = 0
        for pipe, n in zip(self._pipes, self.split, strict=True):
            pipe.send(bodies[first : first + n])
            first += n
        for pipe in self._pipes:
            pipe.recv()
        start = time.perf_counter()
        for pipe in self._pipes:
            pipe.send("go")
        replies = [pipe.recv() for pipe in self._pipes]
        wall = time.perf_counter() - start
        errors = [r[1] for r in replies if r[0] != "ok"]
        if errors:
            raise RuntimeError(f"load generator: {errors[0]}")
        return BlockResult(wall, sum(r[2] for r in replies), len(self._pipes))

    def close(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for p in self._procs:
            p.join(5)
            if p.is_alive():
                p.terminate()

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
