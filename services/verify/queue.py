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
from typing import NamedTuple

from prometheus_client import Counter

from arbiter.errors import ItemResult
from arbiter.services.verify.worker import Item, Scored

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


class Ticket:
    """One request's items in the pool: its own queue (indices into ``items``), its
    results as they arrive, and one future, done when the last result is in.

    One future per request, not per item: at 13 µs an item (the fast path) a future per
    item, its callbacks and ``asyncio.wait`` over them cost a third as much again."""

    __slots__ = ("cancelled", "charge", "done", "items", "left", "queue", "results")

    def __init__(self, items: list[Item], done: asyncio.Future[None]) -> None:
        self.items = items
        self.results: list[Scored | None] = [None] * len(items)
        self.queue: deque[int] = deque(range(len(items)))
        self.left = len(items)  # results still missing
        self.done = done
        self.charge = 0.0  # worker seconds its items have taken so far
        self.cancelled = False
        if not items:
            done.set_result(None)

    def answer(self, index: int, result: Scored) -> None:
        """Item ``index``'s result (the first one given counts)."""
        if self.results[index] is not None or self.cancelled:
            return
        self.results[index] = result
        self.left -= 1
        if not self.left and not self.done.done():
            self.done.set_result(None)


class Job(NamedTuple):
    """One queued item: its request and its index there."""

    ticket: Ticket
    pos: int

    @property
    def item(self) -> Item:
        return self.ticket.items[self.pos]

    @property
    def answered(self) -> bool:
        return self.ticket.cancelled or self.ticket.results[self.pos] is not None


class FairQueue:
    def __init__(self) -> None:
        self._waiting: dict[Ticket, None] = {}  # requests with queued items, in arrival order
        self.queued = 0  # items queued, all requests

    def submit(self, items: list[Item]) -> Ticket:
        """Queue one request's items; ``ticket.done`` resolves once all have results."""
        ticket = Ticket(items, asyncio.get_running_loop().create_future())
        if items:
            self.queued += len(items)
            self._waiting[ticket] = None
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Drop the request's queued items; its results are no longer wanted."""
        ITEMS_DROPPED.inc(len(ticket.queue))
        ticket.cancelled = True
        self.queued -= len(ticket.queue)
        ticket.queue.clear()
        self._waiting.pop(ticket, None)
        if not ticket.done.done():
            ticket.done.cancel()

    def take(self, n: int) -> list[Job]:
        """Up to ``n`` items: a share from every request with items queued, the least
        charged first, so the head of the chunk is the request served least."""
        chunk: list[Job] = []
        while self._waiting and len(chunk) < n:
            order = sorted(self._waiting, key=lambda t: t.charge)
            for k, ticket in enumerate(order):
                share = max(MIN_SHARE, (n - len(chunk)) // (len(order) - k))
                queue = ticket.queue
                while queue and share > 0:
                    index = queue.popleft()
                    self.queued -= 1
                    if ticket.results[index] is None:
                        chunk.append(Job(ticket, index))
                        share -= 1
                if not queue:
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
            if job.answered:
                if ticket.cancelled:
                    ITEMS_DROPPED.inc()
                continue
            ticket.queue.appendleft(job.pos)
            self.queued += 1
            self._waiting[ticket] = None

    def close(self, result: ItemResult) -> None:
        """Answer every queued item with ``result`` (the service is shutting down)."""
        failed: Scored = (result, "failed", None)
        for ticket in self._waiting:
            for index in ticket.queue:
                ticket.answer(index, failed)
            ticket.queue.clear()
        self._waiting.clear()
        self.queued = 0
