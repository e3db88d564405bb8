"""The verify pool's queue: per team, then per request, served fairly.

Every ``submit`` is a request (a ``Ticket``) of a team (``TeamShare``), with its own queue.
Both are charged with the worker time their items took (the pool adds it as results
arrive; a killed item: its deadline). A chunk for a worker takes a share from every team
with items queued, the least charged first (charge divided by the team's weight; ties: the
team served longest ago), and a team's share from its requests the same way, the least
charged first (ties: the earliest), at least ``MIN_SHARE`` items in a row. So another
team's new request leads the next chunk taken, however many requests and items one team
queued before it or however slow theirs are; inside a team, its new request leads the
team's share.

A team's charge is a virtual time: a team that had nothing queued joins at the charge of
the least charged team queued now, never below, so a team idle for an hour cannot then
hold the pool for an hour's worth of others' charge. ``cancel`` drops a request's queued
items; ``requeue`` puts items a worker handed back (or did not reach) at the head of their
own request's queue.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Mapping
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
# Teams remembered with their charge; past this many, those with nothing queued are
# forgotten (they rejoin at the floor, as after any idle spell).
MAX_TEAMS = 4096


class TeamShare:
    """One team's place in the pool: its requests with items queued, in arrival order, and
    the worker time charged to it (a virtual time, see the module docstring)."""

    __slots__ = ("charge", "name", "served", "tickets", "weight")

    def __init__(self, name: str, weight: int) -> None:
        self.name = name
        self.weight = weight
        self.charge = 0.0
        self.served = -1  # the take that last served it (-1: never)
        self.tickets: dict[Ticket, None] = {}

    @property
    def turn(self) -> tuple[float, int]:
        """Sort key: the least charged per unit of weight first, then the longest unserved."""
        return self.charge / self.weight, self.served


class Ticket:
    """One request's items in the pool: its own queue (indices into ``items``), its
    results as they arrive, and one future, done when the last result is in.

    One future per request, not per item: at 13 µs an item (the fast path) a future per
    item, its callbacks and ``asyncio.wait`` over them cost a third as much again."""

    __slots__ = ("cancelled", "charge", "done", "items", "left", "queue", "results", "team")

    def __init__(self, items: list[Item], done: asyncio.Future[None], team: TeamShare) -> None:
        self.items = items
        self.team = team
        self.results: list[Scored | None] = [None] * len(items)
        self.queue: deque[int] = deque(range(len(items)))
        self.left = len(items)  # results still missing
        self.done = done
        self.charge = 0.0  # worker seconds its items have taken so far
        self.cancelled = False
        if not items:
            done.set_result(None)

    def add_charge(self, seconds: float) -> None:
        """Worker time this request's items took: charged to it and to its team."""
        self.charge += seconds
        self.team.charge += seconds

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
    def __init__(self, weights: Mapping[str, int] | None = None) -> None:
        self.weights = dict(weights or {})
        self._teams: dict[str, TeamShare] = {}  # every team seen (bounded: MAX_TEAMS)
        self._waiting: dict[TeamShare, None] = {}  # teams with items queued
        self._takes = 0  # takes so far: when each team was last served
        self.queued = 0  # items queued, all requests

    def submit(self, items: list[Item], team: str = "") -> Ticket:
        """Queue one request's items; ``ticket.done`` resolves once all have results."""
        share = self._team(team)
        ticket = Ticket(items, asyncio.get_running_loop().create_future(), share)
        if items:
            self.queued += len(items)
            self._wait(ticket)
        return ticket

    def _team(self, name: str) -> TeamShare:
        share = self._teams.get(name)
        if share is None:
            if len(self._teams) >= MAX_TEAMS:  # forget the idle ones: they rejoin at the floor
                self._teams = {n: t for n, t in self._teams.items() if t in self._waiting}
            share = self._teams[name] = TeamShare(name, self.weights.get(name, 1))
        return share

    def _wait(self, ticket: Ticket) -> None:
        """Put the ticket's team in line (at the floor of the charges queued now, when it
        had nothing queued) and the ticket in its team's line."""
        team = ticket.team
        if team not in self._waiting:
            if self._waiting:
                floor = min(t.charge / t.weight for t in self._waiting)
                team.charge = max(team.charge, floor * team.weight)
            self._waiting[team] = None
        team.tickets[ticket] = None

    def cancel(self, ticket: Ticket) -> None:
        """Drop the request's queued items; its results are no longer wanted."""
        ITEMS_DROPPED.inc(len(ticket.queue))
        ticket.cancelled = True
        self.queued -= len(ticket.queue)
        ticket.queue.clear()
        team = ticket.team
        team.tickets.pop(ticket, None)
        if not team.tickets:
            self._waiting.pop(team, None)
        if not ticket.done.done():
            ticket.done.cancel()

    def take(self, n: int) -> list[Job]:
        """Up to ``n`` items: a share from every team with items queued, the least charged
        first, and inside a team from its requests the same way; so the head of the chunk
        is the team, and its request, served least."""
        chunk: list[Job] = []
        self._takes += 1
        while self._waiting and len(chunk) < n:
            order = sorted(self._waiting, key=lambda t: t.turn)
            for k, team in enumerate(order):
                share = max(MIN_SHARE, (n - len(chunk)) // (len(order) - k))
                team.served = self._takes
                self._take_team(team, min(share, n - len(chunk)), chunk)
                if not team.tickets:
                    del self._waiting[team]
                if len(chunk) >= n:
                    break
        for job in chunk:
            job.ticket.add_charge(TAKE_CHARGE_S)  # in flight: not free any more
        return chunk

    def _take_team(self, team: TeamShare, n: int, chunk: list[Job]) -> None:
        """Up to ``n`` of one team's items: a share from each of its requests, the least
        charged first, at least ``MIN_SHARE`` in a row (fewer when ``n`` is smaller)."""
        goal = len(chunk) + n
        while team.tickets and len(chunk) < goal:
            order = sorted(team.tickets, key=lambda t: t.charge)
            for k, ticket in enumerate(order):
                share = max(MIN_SHARE, (goal - len(chunk)) // (len(order) - k))
                share = min(share, goal - len(chunk))
                queue = ticket.queue
                while queue and share > 0:
                    index = queue.popleft()
                    self.queued -= 1
                    if ticket.results[index] is None:
                        chunk.append(Job(ticket, index))
                        share -= 1
                if not queue:
                    del team.tickets[ticket]
                if len(chunk) >= goal:
                    break

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
            self._wait(ticket)

    def close(self, result: ItemResult) -> None:
        """Answer every queued item with ``result`` (the service is shutting down)."""
        failed: Scored = (result, "failed", None)
        for team in self._waiting:
            for ticket in team.tickets:
                for index in ticket.queue:
                    ticket.answer(index, failed)
                ticket.queue.clear()
            team.tickets.clear()
        self._waiting.clear()
        self.queued = 0
