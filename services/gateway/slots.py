"""Fair share of a component service's call slots: across teams first, then a team's requests.

The gateway holds at most ``limit`` calls in flight to one component service. With one
first-come queue, a team that posts hundreds of one-sample requests at once (OpenRLHF and
slime do) fills every slot and another team's call waits behind all of them: 10.8 s for a
one-response request behind 70 requests x 6 LaTeX responses. Here

- one team holds at most ``per_team`` slots (fewer than ``limit``), so another team's
  call finds a free slot at once while fewer than ``limit / per_team`` teams are busy;
- when every slot is taken, a freed slot goes to the next team in turn (a team of weight
  ``w`` gets ``w`` slots per turn), and within that team to its next request in turn.

The component service shares its own work the same way (it learns the team from the
``X-Arbiter-Team`` header), so another team's item waits at most about one item's
deadline, whatever one team sends. A waiter that is cancelled (its client left) leaves
the line; one admitted and then cancelled hands its slot on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass, field

from arbiter.services.common.fairness import next_waiter


@dataclass
class _Team:
    weight: int
    held: int = 0
    credit: int = 0  # grants left in this team's current turn
    # request -> its waiters; the dict's order is the turn order within the team
    waiting: dict[Hashable, deque[asyncio.Future[None]]] = field(default_factory=dict)


class TeamSlots:
    """At most ``limit`` holders, at most ``per_team`` of one team (see the module doc)."""

    def __init__(self, limit: int, per_team: int) -> None:
        if not 1 <= per_team <= limit:
            raise ValueError(f"need 1 <= per_team <= limit, got {per_team} and {limit}")
        self.limit = limit
        self.per_team = per_team
        self._held = 0
        self._teams: dict[str, _Team] = {}
        self._turn: deque[str] = deque()  # teams with waiters, in turn order

    @property
    def held(self) -> int:
        return self._held

    def held_by(self, team: str) -> int:
        t = self._teams.get(team)
        return t.held if t is not None else 0

    @contextlib.asynccontextmanager
    async def slot(self, team: str, request: Hashable, weight: int = 1) -> AsyncIterator[None]:
        """Hold one slot for ``team``'s ``request``, waiting for their turn if need be."""
        t = self._teams.get(team)
        if t is None:
            t = self._teams[team] = _Team(weight)
        t.weight = weight
        await self._acquire(team, t, request)
        try:
            yield
        finally:
            self._release(team, t)

    async def _acquire(self, team: str, t: _Team, request: Hashable) -> None:
        free = self._held < self.limit and t.held < self.per_team
        if free and not t.waiting and not self._turn:  # nobody waits: take it
            self._take(t)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not t.waiting:
            self._turn.append(team)
            t.credit = t.weight
        t.waiting.setdefault(request, deque()).append(fut)
        self._grant()  # a slot may be free behind waiters that were cancelled
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # admitted, then cancelled: pass it on
                self._release(team, t)
            raise

    def _take(self, t: _Team) -> None:
        self._held += 1
        t.held += 1

    def _release(self, team: str, t: _Team) -> None:
        self._held -= 1
        t.held -= 1
        if not t.held and not t.waiting:
            self._teams.pop(team, None)
        self._grant()

    def _grant(self) -> None:
        """Hand free slots out: teams in turn, each up to its weight per turn."""
        skipped = 0  # teams passed over in a row because they hold their share
        while self._held < self.limit and self._turn and skipped < len(self._turn):
            team = self._turn[0]
            t = self._teams[team]
            if t.held >= self.per_team:  # it holds its share: the next team's turn
                self._turn.rotate(-1)
                skipped += 1
                continue
            fut = next_waiter(t.waiting)
            if fut is None:  # every waiter of the team was cancelled
                self._turn.popleft()
                if not t.held:
                    del self._teams[team]
                skipped = 0
                continue
            self._take(t)
            fut.set_result(None)
            skipped = 0
            t.credit -= 1
            if not t.waiting:
                self._turn.popleft()
            elif t.credit <= 0:
                t.credit = t.weight
                self._turn.rotate(-1)
