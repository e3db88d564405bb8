"""A small process pool for the math rule: a wall-clock deadline per item, fair across requests.

Not ``concurrent.futures.ProcessPoolExecutor``: killing one of its workers breaks it. Each
worker here is a process with its own socket, watched by one asyncio task ("slot"), and is
sent chunks of queued items, one message each, up to ``DEPTH`` in flight: it never idles
while the event loop parses or answers a request (with one at a time, the workers idled
half the time on two cores). It writes its chunk's id and its item's ``(start time,
index)`` into a shared array: the slot knows the running item's deadline without a message
per item. Past it, the slot kills the worker, answers that item ``timeout``, queues the
rest again (the worker sends finished results every 50 ms) and starts a replacement.

Transport: uvloop makes the parent's socket ends non-blocking, so it uses asyncio streams
in ``multiprocessing.Connection``'s framing (the worker: blocking ``recv``/``send``); a big
item costs the time to copy it and at most its deadline, never a worker restart.

Fairness (``queue.FairQueue``, the fair-share policy of ``common.fairshare``): teams, then
a team's requests, by start-time fair queueing on worker time (a killed item: its
deadline) with one global virtual time; a chunk is made of runs of up to ``MIN_SHARE``
items of one request, each from the request served next, so another team's request leads
the next chunk after at most one run per other team, whatever their history. A chunk that
has run for ``yield_after_s`` while
another request waits gets a "yield" mark: the worker stops after its current item, hands
back the chunks sent behind it unstarted, and gets nothing new until they are back, so the
queue decides what runs next. One request's items delay another's by at most the running
item (≤ its deadline). ``cancel`` drops a request's queued items and marks its chunks.
Workers start from a forkserver with math-verify preloaded (or ``spawn``), niced below
the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import pickle
import signal
import socket
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from arbiter.errors import ItemResult
from arbiter.proto.errors import ErrorKind
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.verify.channel import Chunk, Worker, frame, read_frame
from arbiter.services.verify.queue import FairQueue, Job, Ticket
from arbiter.services.verify.worker import CHUNK, RUNNING, STARTED, YIELD, Item, worker_main

log = logging.getLogger("arbiter.verify.pool")
FAILURES_LOG = ThrottledLog(log)  # one line per 10 s while workers cannot start

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
ITEMS_QUEUED = Gauge(
    "verify_pool_items_queued", "Items waiting in the pool's queue, not yet sent to a worker."
)
YIELDS = Counter(
    "verify_pool_yields_total",
    "Chunks a worker handed back early so that other requests' items could run.",
)

_EOF = object()
# Chunks in flight per worker (it runs one, the rest wait in its socket). On two cores
# (GSM8K batches, fast path) 4 measured ~10 % faster than 2; 6, or chunks of 256, slower.
DEPTH = 4
_READY_TIMEOUT_S = 60.0
_READ_LIMIT = 1 << 20


class WorkerPool:
    def __init__(
        self,
        size: int,
        deadline_s: float,
        mv_timeout_s: int,
        max_chunk: int = 128,
        start_method: str = "forkserver",
        yield_after_s: float = 0.05,
        nice: int = 0,
        team_weights: Mapping[str, int] | None = None,
    ) -> None:
        self.size = size
        self.deadline_s = deadline_s
        self.mv_timeout_s = mv_timeout_s
        self.max_chunk = max_chunk
        self.yield_after_s = yield_after_s
        self.nice = nice
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["arbiter.services.verify.warmup"])
        self._queue = FairQueue(team_weights)
        ITEMS_QUEUED.set_function(lambda: self._queue.queued)  # the process's (one) pool
        self._workers: list[Worker | None] = [None] * size
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
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for i, w in enumerate(self._workers):
            if w is not None:
                self._queue.requeue([j for c in w.inflight for j in c.jobs[c.answered :]])
                w.inflight.clear()
                with contextlib.suppress(Exception):
                    w.writer.write(frame(None))
                await self._retire(i, graceful=True)
        self._queue.close(ItemResult(None, "unavailable", "verify service shutting down"))

    @property
    def queued(self) -> int:
        return self._queue.queued

    @property
    def alive(self) -> int:
        return sum(1 for w in self._workers if w is not None and not w.dead)

    def _spawn(self) -> tuple[BaseProcess, socket.socket, Any]:
        """Start one worker process (runs in a thread: forkserver start-up blocks)."""
        parent_sock, child_sock = socket.socketpair()
        shared = self._ctx.RawArray("d", 4)
        shared[RUNNING] = shared[YIELD] = shared[CHUNK] = -1.0
        child_conn = Connection(child_sock.detach())
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(child_conn, shared, self.mv_timeout_s, self.nice),
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
        w = Worker(proc=proc, writer=writer, shared=shared)
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

    async def _read(self, w: Worker, reader: asyncio.StreamReader) -> None:
        """Move the worker's messages to its inbox; EOF (it died) is a message too."""
        try:
            while True:
                w.inbox.put_nowait(await read_frame(reader))
        except (asyncio.IncompleteReadError, OSError, pickle.UnpicklingError, EOFError):
            w.dead = True
            w.inbox.put_nowait(_EOF)
            w.wake.set()  # wake its slot so it is replaced even when idle

    async def _retire(self, slot: int, graceful: bool = False) -> None:
        w = self._workers[slot]
        if w is None:
            return
        self._workers[slot] = None
        if graceful:
            await asyncio.to_thread(w.proc.join, 2.0)
        # By pid: with the forkserver gone, exitcode reads 255 for a worker still running.
        if w.proc.exitcode is None or (w.proc.exitcode == 255 and not w.dead):
            with contextlib.suppress(OSError, TypeError):
                os.kill(w.proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
        await asyncio.to_thread(w.proc.join, 5.0)
        for task in (w.reader, w.getter):
            if task is not None:
                task.cancel()
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
            except Exception as exc:
                FAILURES_LOG.error("start", "could not start a verify worker", exc_info=exc)
                await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ queue

    def submit(self, items: list[Item], team: str = "") -> Ticket:
        """Queue one request's items (of ``team``: fair share across teams first);
        ``ticket.done`` resolves once all have results."""
        ticket = self._queue.submit(items, team)
        self._fill()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The request is gone: drop its queued items and ask workers running its items to
        stop after their current one."""
        self._queue.cancel(ticket)
        for w in filter(None, self._workers):
            ids = [c.id for c in w.inflight if any(job.ticket is ticket for job in c.jobs)]
            if ids:
                w.shared[YIELD] = max(w.shared[YIELD], float(max(ids)))

    def _fill(self) -> None:
        """Send queued items to live workers: first one chunk to each idle worker, then
        one more to each, up to ``DEPTH`` in flight."""
        for depth in range(1, DEPTH + 1):
            for w in self._workers:
                if not self._queue.queued or self._closing:
                    return
                if w is None or w.dead or len(w.inflight) >= depth:
                    continue
                if w.inflight and w.shared[YIELD] >= w.inflight[-1].id:
                    continue  # handing its chunks back: the queue picks after they return
                jobs = self._queue.take(self._queue.chunk_size(self.size, self.max_chunk))
                if jobs:
                    self._send(w, jobs)

    def _send(self, w: Worker, jobs: list[Job]) -> None:
        chunk = Chunk(next(self._chunk_ids), jobs, time.monotonic())
        flush_at = frozenset(
            i for i in range(1, len(jobs)) if jobs[i].ticket is not jobs[i - 1].ticket
        )
        w.writer.write(frame((chunk.id, [job.item for job in jobs], flush_at)))
        if not w.inflight:
            chunk.yield_at = chunk.sent + self.yield_after_s
            w.wake.set()
        w.inflight.append(chunk)

    # ------------------------------------------------------------------ slots

    async def _slot(self, slot: int) -> None:
        while not self._closing:
            w = self._workers[slot]
            if w is not None and w.inflight:
                await self._watch(slot, w)  # also where a death is noticed (EOF)
            elif w is None or w.dead:
                await self._replace(slot, "died_idle")
                self._fill()
            else:
                w.wake.clear()
                await w.wake.wait()  # set when a chunk is sent to it, or its socket closes

    async def _watch(self, slot: int, w: Worker) -> None:
        """Wait for the worker's next message, its running item's deadline or the time to
        ask it to yield, whichever comes first, and act on it."""
        head = w.inflight[0]
        if w.getter is None:
            w.getter = asyncio.ensure_future(w.inbox.get())
        # Read the chunk id and index first, then the start time (the worker writes them in
        # the other order), and check them again before acting on an overrun.
        running, raw = w.shared[CHUNK], int(w.shared[RUNNING])
        started = max(w.shared[STARTED], head.sent)
        now = time.monotonic()
        left = started + self.deadline_s - now if running <= head.id else self.deadline_s
        index = raw if running == head.id else -1  # -1: head's message not read yet
        same = w.shared[CHUNK] == running and int(w.shared[RUNNING]) == raw
        if left <= 0 and same and not w.getter.done():
            index = max(index, head.answered)
            ITEMS_RUN.inc(min(index + 1, len(head.jobs)) - head.answered)  # stuck, lost
            message = f"no answer within the {self.deadline_s:g} s deadline; worker replaced"
            self._fail(w, "timeout", message, index)
            await self._replace(slot, "deadline")
            self._fill()
            return
        wait = left if head.asked else min(left, head.yield_at - now)
        await asyncio.wait({w.getter}, timeout=max(wait, 0.0) + 0.002)  # always yields
        if w.getter.done():
            msg = w.getter.result()
            w.getter = None
            if msg is _EOF:  # blame the running item; none if the chunk never started
                started = w.shared[CHUNK] == head.id and w.shared[RUNNING] >= 0
                index = max(int(w.shared[RUNNING]), head.answered) if started else -1
                ITEMS_RUN.inc(min(index + 1, len(head.jobs)) - head.answered if started else 0)
                message = f"verify worker died (exit code {w.proc.exitcode})"
                self._fail(w, "internal", message, index)
                await self._replace(slot, "crashed" if started else "died_idle")
                self._fill()
            else:
                self._deliver(w, head, msg)
            return
        if not head.asked and time.monotonic() >= head.yield_at:
            started = w.shared[CHUNK] == head.id and w.shared[RUNNING] >= 0
            mine = {job.ticket for job in head.jobs}
            behind = (job.ticket not in mine for c in list(w.inflight)[1:] for job in c.jobs)
            if started and (self._queue.queued or any(behind)):  # others wait
                # Stop after the current item (it has one), and hand back the chunks sent
                # behind it unstarted: the queue then picks what runs next, fairly.
                w.shared[YIELD] = max(w.shared[YIELD], float(w.inflight[-1].id))
                head.asked = True
            else:
                head.yield_at = time.monotonic() + self.yield_after_s

    def _deliver(self, w: Worker, head: Chunk, msg: Any) -> None:
        """Results from the worker to their requests; at the chunk's last message, the next
        chunk starts running and the worker gets another."""
        _, first, results, seconds, done = msg
        ITEMS_RUN.inc(len(results))
        for (ticket, pos), result, took in zip(head.jobs[first:], results, seconds, strict=False):
            ticket.add_charge(took)
            ticket.answer(pos, result)
        head.answered = first + len(results)
        if not done:
            return
        now = time.monotonic()
        CHUNK_SECONDS.observe(now - head.sent)
        w.inflight.popleft()
        if w.inflight:
            w.inflight[0].yield_at = now + self.yield_after_s
        if head.answered < len(head.jobs):  # handed back early: the rest waits its turn
            YIELDS.inc()
            self._queue.requeue(head.jobs[head.answered :])
        self._fill()

    def _fail(self, w: Worker, kind: ErrorKind, message: str, index: int) -> None:
        """The worker is lost: answer the head chunk's item at ``index`` (-1: none) with an
        error and put everything else it was sent back in the queue."""
        jobs: list[Job] = []
        for n, chunk in enumerate(w.inflight):
            rest = chunk.jobs[chunk.answered :]
            if n == 0 and index >= 0:
                index = min(index, len(chunk.jobs) - 1)
                job = chunk.jobs[index]
                job.ticket.add_charge(self.deadline_s)
                job.ticket.answer(job.pos, (ItemResult(None, kind, message), "failed", None))
            jobs.extend(rest)
        w.inflight.clear()
        self._queue.requeue(jobs)
