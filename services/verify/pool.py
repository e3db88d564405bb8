"""A small process pool for math-verify with a wall-clock deadline per item.

Why not ``concurrent.futures.ProcessPoolExecutor``: killing one of its workers breaks the
whole executor. Here each worker is a process with its own pipe; one asyncio task per
worker ("slot") takes a chunk of queued items, sends it in one message and waits for the
one reply. The worker writes ``(start time, index)`` of the item it is on into a shared
array, so the slot knows the exact deadline of the running item without a message per
item. Past the deadline the slot kills the worker, answers that item ``timeout``, puts the
rest of the chunk back at the front of the queue and starts a replacement; the other
workers keep serving.

Workers start from a forkserver that has math-verify preloaded (a replacement is ready in
milliseconds), or with ``spawn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import multiprocessing as mp
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from arbiter.errors import ItemResult
from arbiter.proto.errors import ErrorKind
from arbiter.services.verify.worker import Item, worker_main

log = logging.getLogger("arbiter.verify.pool")

WORKER_RESTARTS = Counter(
    "verify_worker_restarts_total", "Pool workers replaced, by reason.", ["reason"]
)
WORKERS_ALIVE = Gauge("verify_workers_alive", "Pool workers alive and serving.")
CHUNK_SECONDS = Histogram(
    "verify_pool_chunk_seconds",
    "Wall time of one chunk sent to a worker.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

_EOF = object()
_READY_TIMEOUT_S = 60.0


@dataclass
class Job:
    item: Item
    future: asyncio.Future[ItemResult]


@dataclass
class _Worker:
    proc: BaseProcess
    conn: Connection
    # RawArray('d', 2): [index of the running item (-1: not started, len: sending), its start]
    shared: Any
    inbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    dead: bool = False  # its pipe reached EOF


class WorkerPool:
    def __init__(
        self,
        size: int,
        deadline_s: float,
        mv_timeout_s: int,
        max_chunk: int = 32,
        start_method: str = "forkserver",
    ) -> None:
        self.size = size
        self.deadline_s = deadline_s
        self.mv_timeout_s = mv_timeout_s
        self.max_chunk = max_chunk
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["arbiter.services.verify.worker"])
        self._queue: deque[Job] = deque()
        self._has_work = asyncio.Event()
        self._workers: list[_Worker | None] = [None] * size
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._chunk_ids = itertools.count()
        self.restarts = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        workers = await asyncio.gather(*(asyncio.to_thread(self._spawn) for _ in range(self.size)))
        for i, w in enumerate(workers):
            self._attach(i, w)
        self._tasks = [asyncio.create_task(self._slot(i)) for i in range(self.size)]
        log.info("verify pool: %d workers (%s)", self.size, self._ctx.get_start_method())

    async def close(self) -> None:
        self._closing = True
        self._has_work.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for i, w in enumerate(self._workers):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.conn.send(None)
                await self._retire(i, graceful=True)
        for job in self._queue:
            if not job.future.done():
                job.future.set_result(
                    ItemResult(None, "unavailable", "verify service shutting down")
                )
        self._queue.clear()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def alive(self) -> int:
        return sum(1 for w in self._workers if w is not None and w.proc.is_alive())

    def _spawn(self) -> _Worker:
        """Start one worker and wait for its hello (runs in a thread: it blocks)."""
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        shared = self._ctx.RawArray("d", 2)
        shared[0] = -1.0
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(child_conn, shared, self.mv_timeout_s),
            daemon=True,
            name="verify-worker",
        )
        proc.start()
        child_conn.close()
        if not parent_conn.poll(_READY_TIMEOUT_S):
            proc.kill()
            raise RuntimeError(f"verify worker did not start within {_READY_TIMEOUT_S}s")
        parent_conn.recv()
        return _Worker(proc=proc, conn=parent_conn, shared=shared)

    def _attach(self, slot: int, w: _Worker) -> None:
        loop = asyncio.get_running_loop()

        def readable() -> None:
            try:
                while w.conn.poll():
                    w.inbox.put_nowait(w.conn.recv())
            except (EOFError, OSError):
                loop.remove_reader(w.conn.fileno())
                w.dead = True
                w.inbox.put_nowait(_EOF)
                self._has_work.set()  # wake its slot so it is replaced even when idle

        loop.add_reader(w.conn.fileno(), readable)
        self._workers[slot] = w
        WORKERS_ALIVE.set(self.alive)

    async def _retire(self, slot: int, graceful: bool = False) -> None:
        w = self._workers[slot]
        if w is None:
            return
        self._workers[slot] = None
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(w.conn.fileno())
        if graceful:
            await asyncio.to_thread(w.proc.join, 2.0)
        if w.proc.is_alive():
            w.proc.kill()
        await asyncio.to_thread(w.proc.join, 5.0)
        with contextlib.suppress(Exception):
            w.conn.close()
        WORKERS_ALIVE.set(self.alive)

    async def _replace(self, slot: int, reason: str) -> None:
        await self._retire(slot)
        self.restarts += 1
        WORKER_RESTARTS.labels(reason).inc()
        while not self._closing:
            try:
                self._attach(slot, await asyncio.to_thread(self._spawn))
                return
            except Exception:
                log.exception("could not start a verify worker; retrying in 1 s")
                await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ work

    def submit(self, items: list[Item]) -> list[asyncio.Future[ItemResult]]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[ItemResult]] = []
        for item in items:
            fut: asyncio.Future[ItemResult] = loop.create_future()
            self._queue.append(Job(item, fut))
            futures.append(fut)
        if items:
            self._has_work.set()
        return futures

    def _take(self) -> list[Job]:
        while self._queue and self._queue[0].future.done():  # caller went away
            self._queue.popleft()
        n = min(self.max_chunk, max(1, math.ceil(len(self._queue) / self.size)))
        chunk: list[Job] = []
        while self._queue and len(chunk) < n:
            job = self._queue.popleft()
            if not job.future.done():
                chunk.append(job)
        if not self._queue:
            self._has_work.clear()
        return chunk

    async def _slot(self, slot: int) -> None:
        while not self._closing:
            w = self._workers[slot]
            if w is None or w.dead or not w.proc.is_alive():
                await self._replace(slot, "died_idle")
                continue
            if not self._queue:
                self._has_work.clear()
                await self._has_work.wait()  # also set when a worker's pipe closes
                continue
            chunk = self._take()
            if chunk:
                await self._run_chunk(slot, w, chunk)

    async def _run_chunk(self, slot: int, w: _Worker, chunk: list[Job]) -> None:
        chunk_id = next(self._chunk_ids)
        sent = time.monotonic()
        w.shared[0] = -1.0
        w.shared[1] = sent
        try:
            w.conn.send((chunk_id, [job.item for job in chunk]))
        except (OSError, ValueError):
            self._requeue(chunk)
            await self._replace(slot, "died_idle")
            return
        getter: asyncio.Task[Any] = asyncio.ensure_future(w.inbox.get())
        try:
            while True:
                index = int(w.shared[0])  # read the index first, then its start time
                started = w.shared[1] if index >= 0 else sent
                remaining = max(started, sent) + self.deadline_s - time.monotonic()
                if remaining > 0:
                    await asyncio.wait({getter}, timeout=remaining + 0.005)
                if getter.done():
                    break
                if int(w.shared[0]) != index:
                    continue  # moved on to the next item meanwhile
                self._fail_at(chunk, max(index, 0), "timeout", self._timeout_message())
                await self._replace(slot, "deadline")
                return
        finally:
            if not getter.done():
                getter.cancel()
        msg = getter.result()
        if msg is _EOF:
            index = max(int(w.shared[0]), 0)
            code = w.proc.exitcode
            self._fail_at(chunk, index, "internal", f"verify worker died (exit code {code})")
            await self._replace(slot, "crashed")
            return
        CHUNK_SECONDS.observe(time.monotonic() - sent)
        _, results = msg
        for job, result in zip(chunk, results, strict=True):
            if not job.future.done():
                job.future.set_result(result)

    def _timeout_message(self) -> str:
        return f"no answer within the {self.deadline_s:g} s deadline; worker replaced"

    def _fail_at(self, chunk: list[Job], index: int, kind: ErrorKind, message: str) -> None:
        """Answer the item at ``index`` with an error; requeue the rest of the chunk."""
        index = min(index, len(chunk) - 1)
        job = chunk[index]
        if not job.future.done():
            job.future.set_result(ItemResult(None, kind, message))
        self._requeue(chunk[:index] + chunk[index + 1 :])

    def _requeue(self, jobs: list[Job]) -> None:
        for job in reversed(jobs):
            if not job.future.done():
                self._queue.appendleft(job)
        if self._queue:
            self._has_work.set()
