"""Fair share of a concurrency bound: round-robin across teams first, then across requests.

``asyncio.Semaphore`` admits waiters first come, first served: a request of 1,000 items
queues 1,000 waiters, and the next request's items wait behind all of them. Round-robin
across requests alone is not enough either: a team that sends 70 requests at once (one
sample per POST, as OpenRLHF and slime do) holds 70 places in the line, and another
team's request waits for 70 slots to free.

Here each waiter names its team and its key (its request). When a slot frees it goes to
the next team in turn, and inside that team to the team's next request in turn; a team
(and a request) that still has waiters goes to the back of its line. So another team's
request waits for at most one slot to free per team ahead of it, whatever those teams
sent. A team's ``weight`` (a per-team setting, default 1) is how many slots it gets in a
row on its turn.

A waiter that is cancelled (its request's client went away) leaves the line; one that
was admitted and then cancelled hands its slot on.

Components learn the team from ``arbiter.proto.common.TEAM_HEADER``, which the gateway
sets on every call; ``team_of`` reads it. Without it a call belongs to one anonymous team.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Hashable, Mapping
from typing import Annotated

from fastapi import Depends, Request

from arbiter.proto.common import TEAM_HEADER

ANONYMOUS = ""  # the team of a call that names none (a component reached directly)
MAX_TEAM_CHARS = 128  # a longer header is cut: it names a line, it is never echoed


def team_of(request: Request) -> str:
    """The team a component call belongs to (``TEAM_HEADER``), ``ANONYMOUS`` without one."""
    value = request.headers.get(TEAM_HEADER)
    return value.strip()[:MAX_TEAM_CHARS] if value else ANONYMOUS


async def _team(request: Request) -> str:  # async: no thread hop per request
    return team_of(request)


# A route's team, as a dependency: not a declared header, so it stays out of the OpenAPI
# schema (callers never send it; only the gateway does).
TeamDep = Annotated[str, Depends(_team)]


class _TeamLine:
    """One team's waiters: key (request) -> its waiters; the dict's order is the turn order."""

    __slots__ = ("keys", "served")

    def __init__(self) -> None:
        self.keys: dict[Hashable, deque[asyncio.Future[None]]] = {}
        self.served = 0  # slots granted in a row on this turn

    def next_waiter(self) -> asyncio.Future[None] | None:
        """The next request's first live waiter; that request goes to the back."""
        return next_waiter(self.keys)


def next_waiter(keys: dict[Hashable, deque[asyncio.Future[None]]]) -> asyncio.Future[None] | None:
    """The first live waiter of the first key in ``keys`` (a team's requests, in turn order);
    that key goes to the back if it has more, keys with none left are dropped. Shared by the
    components' ``FairLimiter`` and the gateway's ``TeamSlots``."""
    while keys:
        key = next(iter(keys))
        line = keys.pop(key)
        while line and line[0].done():  # cancelled while waiting
            line.popleft()
        if not line:
            continue
        fut = line.popleft()
        if line:
            keys[key] = line  # back of the line: the team's others go first
        return fut
    return None


class FairLimiter:
    """At most ``limit`` holders at once; waiters admitted round-robin across teams, then
    across each team's keys. ``weights``: slots per turn by team name (default 1)."""

    def __init__(self, limit: int, weights: Mapping[str, int] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.weights = dict(weights or {})
        self._held = 0
        # team -> its line; the dict's order is the turn order across teams
        self._teams: dict[str, _TeamLine] = {}

    @property
    def held(self) -> int:
        return self._held

    @property
    def waiting(self) -> int:
        return sum(
            1 for t in self._teams.values() for q in t.keys.values() for f in q if not f.done()
        )

    @contextlib.asynccontextmanager
    async def slot(self, key: Hashable, team: str = ANONYMOUS) -> AsyncIterator[None]:
        """Hold one of the ``limit`` slots, waiting for the turn of ``team`` and, inside
        it, of ``key`` if all are taken."""
        await self._acquire(key, team)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, key: Hashable, team: str) -> None:
        if self._held < self.limit and not self._teams:
            self._held += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line = self._teams.get(team)
        if line is None:
            line = self._teams[team] = _TeamLine()
        line.keys.setdefault(key, deque()).append(fut)
        self._grant()  # a slot may be free behind waiters that were cancelled
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # admitted, then cancelled: pass it on
                self._release()
            raise

    def _release(self) -> None:
        self._held -= 1
        self._grant()

    def _grant(self) -> None:
        while self._held < self.limit and self._teams:
            team = next(iter(self._teams))
            line = self._teams[team]
            fut = line.next_waiter()
            if fut is None:
                del self._teams[team]
                continue
            line.served += 1
            if not line.keys:
                del self._teams[team]
            elif line.served >= self.weights.get(team, 1):
                line.served = 0
                del self._teams[team]
                self._teams[team] = line  # back of the line: the other teams go first
            self._held += 1
            fut.set_result(None)
