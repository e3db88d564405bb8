"""The verify pool's queue: the fair-share policy (``common.fairshare``) charged by worker time.

Every ``submit`` is a request (a ``Ticket``) of a team. Its items queue in the policy:
teams first, then a team's requests, by start-time fair queueing with one global virtual
time. Each item is charged an estimate when it is taken (the mean worker time of recent
items) and its real worker time when its result arrives (the pool adds it; a killed item:
its deadline), the estimate given back. A chunk for a worker is made of runs of up to
``MIN_SHARE`` items of one request, each run from the request the policy serves next.

So another team's request leads the next chunk taken after at most one run per other
team, whatever those teams queued, however slow their items, and whatever they were
served before: a team with an hour of history rejoins at the others' virtual time, not
behind it, and a team idle for an hour cannot then hold the pool for an hour either.
Inside a team, its new request leads the team's next run the same way. ``cancel`` drops a
request's queued items; ``requeue`` puts items a worker handed back (or did not reach) at
the head of their own request's queue, their estimate given back.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from typing import NamedTuple, cast

from prometheus_client import Counter

from arbiter.errors import ItemResult
from arbiter.services.common.fairshare import FairShare
from arbiter.services.verify.worker import Item, Scored

ITEMS_DROPPED = Counter(
    "verify_pool_items_dropped_total",
    "Queued items never run because their request was cancelled (its client left).",
)

# A request gives up to this many items in a row to a chunk (when it has them): one
# result message per request per chunk, and its group's reference parsed once, not once
# per item. Fairness does not suffer: a chunk is handed back early when others wait.
MIN_SHARE = 8
# Teams remembered while idle with debt (their items in flight cost more than estimated);
# past this many the oldest are forgotten and rejoin even, as after the pool drains.
MAX_TEAMS = 4096
# The first estimate of an item's worker time, before any has been measured; then a
# moving average of measured items (weight of the newest: ESTIMATE_WEIGHT).
FIRST_ESTIMATE_S = 0.001
ESTIMATE_WEIGHT = 0.05


class Ticket:
    """One request's items in the pool: its results as they arrive, and one future, done
    when the last result is in. Its queued items live in the queue's policy.

    One future per request, not per item: at 13 µs an item (the fast path) a future per
    item, its callbacks and ``asyncio.wait`` over them cost a third as much again."""

    __slots__ = (
        "_queue", "cancelled", "charge", "done", "estimate", "items", "left", "results",
        "running", "team",
    )  # fmt: skip

    def __init__(
        self, items: list[Item], done: asyncio.Future[None], team: str, queue: FairQueue
    ) -> None:
        self.items = items
        self.team = team
        self._queue = queue
        self.results: list[Scored | None] = [None] * len(items)
        self.left = len(items)  # results still missing
        self.done = done
        self.charge = 0.0  # worker seconds its items have taken so far
        self.estimate = queue.estimate  # charged per item when taken, given back after
        self.running: set[int] = set()  # items taken and not yet answered or handed back
        self.cancelled = False
        if not items:
            done.set_result(None)

    def add_charge(self, seconds: float) -> None:
        """Worker time this request's items took: charged to it and to its team."""
        self.charge += seconds
        self._queue.charge(self, seconds)

    def settle(self, index: int) -> None:
        """Item ``index`` is no longer in flight: its estimate is given back."""
        if index in self.running:
            self.running.discard(index)
            self._queue.charge(self, -self.estimate, done=1)

    def answer(self, index: int, result: Scored) -> None:
        """Item ``index``'s result (the first one given counts)."""
        self.settle(index)
        if self.results[index] is not None or self.cancelled:
            return
        self.results[index] = result
        self.left -= 1
        if not self.left and not self.done.done():
            self.done.set_result(None)


class Job(NamedTuple):
    """One item taken from the queue: its request and its index there."""

    ticket: Ticket
    pos: int

    @property
    def item(self) -> Item:
        return self.ticket.items[self.pos]

    @property
    def answered(self) -> bool:
        return self.ticket.cancelled or self.ticket.results[self.pos] is not None


class FairQueue:
    def __init__(self, weights: Mapping[str, int] | None = None) -> None:
        self.policy: FairShare[int] = FairShare(weights, max_idle=MAX_TEAMS)
        self.estimate = FIRST_ESTIMATE_S  # worker seconds per item, a moving average
        # Charges and items out of flight per request, given to the policy at once before
        # it is next asked or told anything: one call per request and chunk, not two per
        # item (at 13 µs an item on the fast path, they cost as much as the item).
        self._pending: dict[Ticket, list[float]] = {}

    @property
    def queued(self) -> int:
        """Items queued, all requests."""
        return self.policy.queued

    def submit(self, items: list[Item], team: str = "") -> Ticket:
        """Queue one request's items; ``ticket.done`` resolves once all have results."""
        ticket = Ticket(items, asyncio.get_running_loop().create_future(), team, self)
        self._flush()
        if items:
            self.policy.push_many(team, ticket, range(len(items)), ticket.estimate)
        return ticket

    def charge(self, ticket: Ticket, seconds: float, done: int = 0) -> None:
        """Charge ``seconds`` to ``ticket`` (a refund when negative) and take ``done`` of its
        items out of flight; a measured item's time (positive, not done) is learned from."""
        pending = self._pending.get(ticket)
        if pending is None:
            self._pending[ticket] = [seconds, done]
        else:
            pending[0] += seconds
            pending[1] += done
        if seconds > 0:
            self.estimate += ESTIMATE_WEIGHT * (seconds - self.estimate)

    def _flush(self) -> None:
        if self._pending:
            for ticket, (seconds, done) in self._pending.items():
                self.policy.adjust(ticket.team, ticket, seconds, int(done))
            self._pending.clear()

    def cancel(self, ticket: Ticket) -> None:
        """Drop the request's queued items; its results are no longer wanted."""
        self._flush()
        ITEMS_DROPPED.inc(len(self.policy.cancel(ticket.team, ticket)))
        ticket.cancelled = True
        if not ticket.done.done():
            ticket.done.cancel()

    def take(self, n: int) -> list[Job]:
        """Up to ``n`` items, in runs of up to ``MIN_SHARE`` of one request, each run from
        the request the policy serves next (see the module docstring)."""
        chunk: list[Job] = []
        self._flush()
        while len(chunk) < n:
            grant = self.policy.pop(min(MIN_SHARE, n - len(chunk)))
            if grant is None:
                break
            ticket = cast(Ticket, grant.request)
            for index in grant.items:
                ticket.running.add(index)
                if ticket.results[index] is None:
                    chunk.append(Job(ticket, index))
                else:  # answered meanwhile (a duplicate result): nothing to run
                    ticket.settle(index)
        return chunk

    def chunk_size(self, workers: int, max_chunk: int) -> int:
        """An even split of the queue over the workers, at most ``max_chunk``."""
        return min(max_chunk, max(1, math.ceil(self.queued / workers)))

    def requeue(self, jobs: list[Job]) -> None:
        """Put jobs back at the head of their own request's queue (order kept)."""
        self._flush()
        for job in reversed(jobs):
            ticket = job.ticket
            if not job.answered:
                self.policy.push(ticket.team, ticket, job.pos, ticket.estimate, front=True)
            elif ticket.cancelled:
                ITEMS_DROPPED.inc()
            ticket.settle(job.pos)  # after the push: the team keeps its place meanwhile

    def close(self, result: ItemResult) -> None:
        """Answer every queued item with ``result`` (the service is shutting down)."""
        failed: Scored = (result, "failed", None)
        for _, ticket, index in self.policy.clear():
            cast(Ticket, ticket).answer(index, failed)
        self._flush()
