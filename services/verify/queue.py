"""The verify pool's queue: one queue per request, served fairly.

Every ``submit`` is a request (a ``Ticket``) with its own queue, charged with the worker
time its items took (the pool adds it as results arrive; a killed item: its deadline). A
chunk for a worker takes a share from every request with items queued, the least charged
first (ties: the earliest), at least ``MIN_SHARE`` items in a row: so a new request's items
lead the next chunk taken, however many items others queued before it or however slow
theirs are. ``cancel`` drops a request's queued items; ``requeue`` puts items a worker
handed back (or did not reach) at the head of their own request's queue.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import Counter

from arbiter.errors import ItemResult
from arbiter.services.verify.worker import Item

ITEMS_DROPPED = Counter(
    "verify_pool_items_dropped_total",
    "Queued items never run because their request was cancelled (its client left).",
)

# Charged to a request per item when its chunk is taken (its real time is added after).
TAKE_CHARGE_S = 0.001
# A request gives at least this many items in a row to a chunk (when it has them): one
# result message per request per chunk, and its group's reference parsed once, not once
# per item. Fairness does not suffer: a chunk is handed back early when others wait.
MIN_SHARE = 8


@dataclass(eq=False)
class Ticket:
    """One request's items in the pool: its own queue, and the futures of its results."""

    futures: list[asyncio.Future[ItemResult]]
    jobs: deque[Job] = field(default_factory=deque)
    charge: float = 0.0  # worker seconds its items have taken so far
    cancelled: bool = False


@dataclass(eq=False)
class Job:
    item: Item
    future: asyncio.Future[ItemResult]
    ticket: Ticket


class FairQueue:
    def __init__(self) -> None:
        self._waiting: dict[Ticket, None] = {}  # requests with queued items, in arrival order
        self.queued = 0  # items queued, all requests

    def submit(self, items: list[Item]) -> Ticket:
        """Queue one request's items; ``ticket.futures`` give their results, in order."""
        loop = asyncio.get_running_loop()
        ticket = Ticket(futures=[])
        for item in items:
            fut: asyncio.Future[ItemResult] = loop.create_future()
            ticket.futures.append(fut)
            ticket.jobs.append(Job(item, fut, ticket))
        if items:
            self.queued += len(items)
            self._waiting[ticket] = None
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Drop the request's queued items and cancel its futures."""
        ticket.cancelled = True
        ITEMS_DROPPED.inc(sum(1 for job in ticket.jobs if not job.future.done()))
        self.queued -= len(ticket.jobs)
        ticket.jobs.clear()
        self._waiting.pop(ticket, None)
        for fut in ticket.futures:
            fut.cancel()

    def take(self, n: int) -> list[Job]:
        """Up to ``n`` items: a share from every request with items queued, the least
        charged first, so the head of the chunk is the request served least."""
        chunk: list[Job] = []
        while self._waiting and len(chunk) < n:
            order = sorted(self._waiting, key=lambda t: t.charge)
            for k, ticket in enumerate(order):
                share = max(MIN_SHARE, (n - len(chunk)) // (len(order) - k))
                while ticket.jobs and share > 0:
                    job = ticket.jobs.popleft()
                    self.queued -= 1
                    if not job.future.done():
                        chunk.append(job)
                        share -= 1
                    elif job.future.cancelled():  # its caller went away
                        ITEMS_DROPPED.inc()
                if not ticket.jobs:
                    del self._waiting[ticket]
                if len(chunk) >= n:
                    break
        for job in chunk:
            job.ticket.charge += TAKE_CHARGE_S  # in flight: not free any more
        return chunk

    def chunk_size(self, workers: int, max_chunk: int) -> int:
        """An even split of the queue over the workers, at most ``max_chunk``."""
        return min(max_chunk, max(1, math.ceil(self.queued / workers)))

    def requeue(self, jobs: list[Job]) -> None:
        """Put jobs back at the head of their own request's queue (order kept)."""
        for job in reversed(jobs):
            ticket = job.ticket
            if job.future.done() or ticket.cancelled:
                if job.future.cancelled() or ticket.cancelled:
                    ITEMS_DROPPED.inc()
                continue
            ticket.jobs.appendleft(job)
            self.queued += 1
            self._waiting[ticket] = None

    def close(self, result: ItemResult) -> None:
        """Answer every queued item with ``result`` (the service is shutting down)."""
        for ticket in self._waiting:
            for job in ticket.jobs:
                if not job.future.done():
                    job.future.set_result(result)
            ticket.jobs.clear()
        self._waiting.clear()
        self.queued = 0
