"""A small process pool for math-verify: a wall-clock deadline per item, fair across requests.

Why not ``concurrent.futures.ProcessPoolExecutor``: killing one of its workers breaks the
whole executor. Here each worker is a process with its own socket; one asyncio task per
worker ("slot") takes a chunk of queued items, sends it in one message and waits for the
one reply. The worker writes ``(start time, index)`` of the item it is on into a shared
array, so the slot knows the exact deadline of the running item without a message per
item. Past the deadline the slot kills the worker, answers that item ``timeout``, puts the
rest of the chunk back in the queue and starts a replacement; the other workers keep
serving.

Transport: the event loop (uvloop under uvicorn) owns the parent's end of each socket and
makes it non-blocking, so a blocking ``Connection.send`` of a large chunk would raise
``BlockingIOError`` half-way. The parent therefore writes and reads with asyncio streams
(partial writes and reads are the loop's business), in ``multiprocessing.Connection``'s
own framing, so the worker keeps its plain blocking ``recv``/``send``. A big item costs
the time to copy it and at most its deadline; it never looks like a dead worker.

Fairness (the queue is ``queue.FairQueue``): every ``submit`` is a request with its own
queue, charged with the worker time its items took (a killed item: its deadline). A chunk
is filled from every request with items queued, a share each, the least charged first: a
new request's items lead the next chunk taken, however many items others queued before it
or however slow theirs are. And a slot whose chunk has run for ``yield_after_s`` while
other items wait raises a flag in the shared array: the worker stops after its current
item and sends what it has; the rest goes back to the queue. So one request's items delay
another's by at most the running item (≤ its deadline), however many it sent. ``cancel``
drops a request's queued items and flags chunks holding its items; an item already
running is left to finish or to its deadline (killing it would cost a respawn for at most
one item's time).

Workers start from a forkserver that has math-verify preloaded (a replacement is ready in
milliseconds), or with ``spawn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing as mp
import pickle
import socket
import struct
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from arbiter.errors import ItemResult
from arbiter.proto.errors import ErrorKind
from arbiter.services.verify.queue import FairQueue, Job, Ticket
from arbiter.services.verify.worker import RUNNING, STARTED, YIELD, Item, worker_main

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
ITEMS_RUN = Counter("verify_pool_items_run_total", "Items a pool worker started scoring.")
YIELDS = Counter(
    "verify_pool_yields_total",
    "Chunks a worker handed back early so that other requests' items could run.",
)

_EOF = object()
_READY_TIMEOUT_S = 60.0
_READ_LIMIT = 1 << 20


@dataclass(eq=False)
class _Worker:
    proc: BaseProcess
    writer: asyncio.StreamWriter
    # RawArray('d', 3): [index of the running item (-1: not started, len: sending),
    # its start time, the "stop after this item" flag] (see worker.py)
    shared: Any
    inbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    reader: asyncio.Task[None] | None = None
    dead: bool = False  # its socket reached EOF
    chunk: list[Job] = field(default_factory=list)  # the chunk it is running


def _frame(msg: Any) -> bytes:
    """``msg`` in ``multiprocessing.Connection``'s framing (what the worker's recv reads)."""
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    n = len(data)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return header + data


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (n,) = struct.unpack("!i", await reader.readexactly(4))
    if n == -1:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    return pickle.loads(await reader.readexactly(n))


class WorkerPool:
    def __init__(
        self,
        size: int,
        deadline_s: float,
        mv_timeout_s: int,
        max_chunk: int = 32,
        start_method: str = "forkserver",
        yield_after_s: float = 0.05,
    ) -> None:
        self.size = size
        self.deadline_s = deadline_s
        self.mv_timeout_s = mv_timeout_s
        self.max_chunk = max_chunk
        self.yield_after_s = yield_after_s
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["arbiter.services.verify.warmup"])
        self._queue = FairQueue()
        self._has_work = asyncio.Event()
        self._workers: list[_Worker | None] = [None] * size
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._chunk_ids = itertools.count()
        self.restarts = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await asyncio.gather(*(self._start_worker(i) for i in range(self.size)))
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
                    w.writer.write(_frame(None))
                await self._retire(i, graceful=True)
        self._queue.close(ItemResult(None, "unavailable", "verify service shutting down"))

    @property
    def queued(self) -> int:
        return self._queue.queued

    @property
    def alive(self) -> int:
        return sum(1 for w in self._workers if w is not None and w.proc.is_alive())

    def _spawn(self) -> tuple[BaseProcess, socket.socket, Any]:
        """Start one worker process (runs in a thread: forkserver start-up blocks)."""
        parent_sock, child_sock = socket.socketpair()
        shared = self._ctx.RawArray("d", 3)
        shared[RUNNING] = -1.0
        child_conn = Connection(child_sock.detach())
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(child_conn, shared, self.mv_timeout_s),
            daemon=True,
            name="verify-worker",
        )
        try:
            proc.start()
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_conn.close()
        return proc, parent_sock, shared

    async def _start_worker(self, slot: int) -> None:
        """Spawn a worker, wire its socket to the loop, wait for its hello, put it in ``slot``."""
        proc, sock, shared = await asyncio.to_thread(self._spawn)
        try:
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=_READ_LIMIT)
        except BaseException:
            sock.close()
            proc.kill()
            raise
        w = _Worker(proc=proc, writer=writer, shared=shared)
        w.reader = asyncio.create_task(self._read(w, reader), name="verify-worker-reader")
        try:
            hello = await asyncio.wait_for(w.inbox.get(), _READY_TIMEOUT_S)
            if hello is _EOF:
                raise RuntimeError(f"verify worker exited at start (code {proc.exitcode})")
        except BaseException:
            self._workers[slot] = w
            await self._retire(slot)
            raise
        self._workers[slot] = w
        WORKERS_ALIVE.set(self.alive)

    async def _read(self, w: _Worker, reader: asyncio.StreamReader) -> None:
        """Move the worker's messages to its inbox; EOF (it died) is a message too."""
        try:
            while True:
                w.inbox.put_nowait(await _read_frame(reader))
        except (asyncio.IncompleteReadError, OSError, pickle.UnpicklingError, EOFError):
            w.dead = True
            w.inbox.put_nowait(_EOF)
            self._has_work.set()  # wake its slot so it is replaced even when idle

    async def _retire(self, slot: int, graceful: bool = False) -> None:
        w = self._workers[slot]
        if w is None:
            return
        self._workers[slot] = None
        if graceful:
            await asyncio.to_thread(w.proc.join, 2.0)
        if w.proc.is_alive():
            w.proc.kill()
        await asyncio.to_thread(w.proc.join, 5.0)
        if w.reader is not None:
            w.reader.cancel()
        with contextlib.suppress(Exception):
            w.writer.close()
        WORKERS_ALIVE.set(self.alive)

    async def _replace(self, slot: int, reason: str) -> None:
        await self._retire(slot)
        self.restarts += 1
        WORKER_RESTARTS.labels(reason).inc()
        while not self._closing:
            try:
                await self._start_worker(slot)
                return
            except Exception:
                log.exception("could not start a verify worker; retrying in 1 s")
                await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ queue

    def submit(self, items: list[Item]) -> Ticket:
        """Queue one request's items; ``ticket.futures`` give their results, in order."""
        ticket = self._queue.submit(items)
        if items:
            self._has_work.set()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The request is gone: drop its queued items, cancel its futures, and ask workers
        running its items to stop after their current one."""
        self._queue.cancel(ticket)
        for w in self._workers:
            if w is not None and any(job.ticket is ticket for job in w.chunk):
                w.shared[YIELD] = 1.0

    def _take(self) -> list[Job]:
        chunk = self._queue.take(self._queue.chunk_size(self.size, self.max_chunk))
        if not self._queue.queued:
            self._has_work.clear()
        return chunk

    def _requeue(self, jobs: list[Job]) -> None:
        self._queue.requeue(jobs)
        if self._queue.queued:
            self._has_work.set()

    # ------------------------------------------------------------------ slots

    async def _slot(self, slot: int) -> None:
        while not self._closing:
            w = self._workers[slot]
            if w is None or w.dead or not w.proc.is_alive():
                await self._replace(slot, "died_idle")
                continue
            if not self._queue.queued:
                self._has_work.clear()
                await self._has_work.wait()  # also set when a worker's socket closes
                continue
            chunk = self._take()
            if chunk:
                w.chunk = chunk
                try:
                    await self._run_chunk(slot, w, chunk)
                finally:
                    w.chunk = []

    async def _run_chunk(self, slot: int, w: _Worker, chunk: list[Job]) -> None:
        sent = time.monotonic()
        w.shared[RUNNING] = -1.0
        w.shared[STARTED] = sent
        w.shared[YIELD] = 0.0
        flush_at = frozenset(
            i for i in range(1, len(chunk)) if chunk[i].ticket is not chunk[i - 1].ticket
        )
        items = [job.item for job in chunk]
        w.writer.write(_frame((next(self._chunk_ids), items, flush_at)))
        yield_at = sent + self.yield_after_s
        asked = len(chunk) == 1  # nothing to hand back
        answered = 0  # results received: chunk[:answered]
        getter: asyncio.Task[Any] | None = None
        try:
            while True:
                if getter is None:
                    getter = asyncio.ensure_future(w.inbox.get())
                index = int(w.shared[RUNNING])  # read the index first, then its start time
                started = max(w.shared[STARTED] if index >= 0 else sent, sent)
                now = time.monotonic()
                left = started + self.deadline_s - now
                if left <= 0 and int(w.shared[RUNNING]) == index:
                    index = max(index, answered)
                    ITEMS_RUN.inc(index + 1 - answered)  # the stuck one, and any lost
                    self._fail_at(chunk, index, "timeout", self._timeout_message())
                    await self._replace(slot, "deadline")
                    return
                wait = left if asked else min(left, yield_at - now)
                if wait > 0:
                    await asyncio.wait({getter}, timeout=wait + 0.002)
                if getter.done():
                    msg = getter.result()
                    getter = None
                    if msg is _EOF:
                        index = max(int(w.shared[RUNNING]), answered)
                        ITEMS_RUN.inc(min(index + 1, len(chunk)) - answered)
                        code = w.proc.exitcode
                        message = f"verify worker died (exit code {code})"
                        self._fail_at(chunk, index, "internal", message)
                        await self._replace(slot, "crashed")
                        return
                    answered, done = self._deliver(chunk, msg)
                    if done:
                        break
                    continue
                if not asked and time.monotonic() >= yield_at:
                    if self._queue.queued:  # others wait: stop after the current item
                        w.shared[YIELD] = 1.0
                        asked = True
                    else:
                        yield_at = time.monotonic() + self.yield_after_s
        finally:
            if getter is not None and not getter.done():
                getter.cancel()
        CHUNK_SECONDS.observe(time.monotonic() - sent)
        if answered < len(chunk):  # handed back early: the rest waits its turn
            YIELDS.inc()
            self._requeue(chunk[answered:])

    @staticmethod
    def _deliver(chunk: list[Job], msg: Any) -> tuple[int, bool]:
        """Results from the worker to their futures: (results so far, whether it was the
        chunk's last message)."""
        _, first, results, seconds, done = msg
        ITEMS_RUN.inc(len(results))
        for job, result, took in zip(chunk[first:], results, seconds, strict=False):
            job.ticket.charge += took
            if not job.future.done():
                job.future.set_result(result)
        return first + len(results), done

    def _timeout_message(self) -> str:
        return f"no answer within the {self.deadline_s:g} s deadline; worker replaced"

    def _fail_at(self, chunk: list[Job], index: int, kind: ErrorKind, message: str) -> None:
        """Answer the item at ``index`` with an error; requeue the rest of the chunk."""
        index = min(index, len(chunk) - 1)
        job = chunk[index]
        job.ticket.charge += self.deadline_s
        if not job.future.done():
            job.future.set_result(ItemResult(None, kind, message))
        self._requeue(chunk[:index] + chunk[index + 1 :])
