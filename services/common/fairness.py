"""Fair share of a concurrency bound: the fair-share policy (``fairshare``) as a limiter.

``asyncio.Semaphore`` admits waiters first come, first served: a request of 1,000 items
queues 1,000 waiters, and the next request's items wait behind all of them; one team's
70 requests sent at once (one sample per POST, as OpenRLHF and slime send) hold 70
places in the line. Here each waiter names its team and its key (its request), and a
freed slot goes to the waiter ``fairshare.FairShare`` picks: teams first (start-time fair
queueing by slot-uses, weighted by ``<PREFIX>_TEAM_WEIGHTS``), then the team's requests.
So another team's waiter is admitted after at most one admission per other team with
waiters, whatever those teams sent or were served before; a team of weight ``w`` gets
``w`` times the slot-uses of a team of weight 1 while both wait. With ``per_team`` no
team holds more than that many slots (the scoring core's fan-out: ``scoring.slots``).

A waiter that is cancelled (its request's client went away) leaves the line; one that
was admitted and then cancelled hands its slot on.

Components learn the team from ``arbiter.proto.common.TEAM_HEADER``, which the gateway
sets on every call; ``team_of`` reads it. Without it a call belongs to one anonymous team.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable, Mapping
from typing import Annotated, Any

from fastapi import Depends, Request

from arbiter.proto.common import TEAM_HEADER
from arbiter.services.common.fairshare import FairShare, Grant

_Waiter = asyncio.Future[Any]  # done with the waiter's grant once it is admitted
_Grant = Grant[_Waiter]

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


class FairLimiter:
    """At most ``limit`` holders at once, at most ``per_team`` of one team (default: no
    cap); waiters admitted by the fair-share policy (see the module docstring).
    ``weights``: by team name (default 1)."""

    def __init__(
        self, limit: int, weights: Mapping[str, int] | None = None, per_team: int | None = None
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.per_team = limit if per_team is None else per_team
        self._policy: FairShare[_Waiter] = FairShare(weights, dead=lambda w: w.done())
        self._held = 0
        self._held_by: dict[str, int] = {}
        self._waiting = 0

    @property
    def held(self) -> int:
        return self._held

    @property
    def waiting(self) -> int:
        return self._waiting

    def held_by(self, team: str) -> int:
        return self._held_by.get(team, 0)

    @contextlib.asynccontextmanager
    async def slot(
        self, key: Hashable, team: str = ANONYMOUS, weight: int | None = None
    ) -> AsyncIterator[None]:
        """Hold one of the ``limit`` slots, waiting for the turn of ``team`` and, inside
        it, of ``key`` if need be; ``weight`` overrides the team's configured one."""
        grant = await self._acquire(key, team, weight)
        try:
            yield
        finally:
            self._release(grant)

    async def _acquire(self, key: Hashable, team: str, weight: int | None) -> _Grant:
        waiter: _Waiter = asyncio.get_running_loop().create_future()
        self._policy.push(team, key, waiter, 1.0, weight=weight)
        self._waiting += 1
        self._grant()
        try:
            return await waiter  # done already when a slot was free: no suspension
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # admitted, then cancelled
                self._release(waiter.result())
            else:
                self._waiting -= 1
                self._policy.prune(team, key)
            raise

    def _release(self, grant: _Grant) -> None:
        self._held -= 1
        left = self._held_by[grant.team] - 1
        if left:
            self._held_by[grant.team] = left
        else:
            del self._held_by[grant.team]
        self._policy.settle(grant)  # one slot-use, as estimated
        self._grant()

    def _has_room(self, team: str) -> bool:
        return self._held_by.get(team, 0) < self.per_team

    def _grant(self) -> None:
        capped = self.per_team < self.limit
        while self._held < self.limit:
            grant = self._policy.pop(eligible=self._has_room if capped else None)
            if grant is None:
                return
            self._held += 1
            self._held_by[grant.team] = self._held_by.get(grant.team, 0) + 1
            self._waiting -= 1
            grant.items[0].set_result(grant)
