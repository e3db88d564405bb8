"""One fair-share policy for every queue: teams first, then a team's requests, by cost.

Start-time fair queueing (SFQ: Goyal, Vin and Cheng, SIGCOMM 1996) at two levels: teams
(weights from ``<PREFIX>_TEAM_WEIGHTS``, default 1), then a team's requests (weight 1).
Each item has a cost in the service's unit (a call, a program, a text or its tokens,
worker seconds). A global virtual time ``V`` never goes back: it is the start tag of the
team last dispatched from. A team dispatched ``c`` at start tag ``S`` gets the finish tag
``F = S + c / weight``; it starts at ``S = F`` while it stays queued and at
``S = max(F, V)`` when it joins. ``pop`` serves the least start tag (ties: the team served,
joined from idle, or handed items back longest ago), and inside that team its request with
the least start tag, by the same rule on the team's own virtual time. A cost may be an estimate at
dispatch: ``settle`` (or ``adjust``) moves ``F`` by the difference once it is known.

The bound. Every queued team has ``S >= V``: ``V`` is the least start tag at the last
dispatch, a team joins at ``max(F, V)``, a dispatch only raises tags, and a refund
(``settle`` below the estimate, an item handed back unrun) stops at ``V``. So a team whose
history is settled (``F <= V``) joins at ``S = V``. Another team ``g`` goes before it only
while ``S_g <= V``: for at most one dispatch of ``g`` (``S_g`` then rises by ``c_g / w_g``),
and teams that join later lose the tie (so does a team whose items come back unrun, refunded
down to ``V``: it counts as served then). So a joining team waits for at most ONE dispatch
per other team, whatever they queued or did before and however wrong their estimates.
While two teams stay queued, their service divided by their weights differs by at most
one item's cost over each weight (SFQ's fairness bound): weights scale the shares. With
runs (``pop(limit=k)``), read "one run" for "one item".

History neither helps nor hurts. ``max(F, V)`` forgets credit (an hour idle buys no hour
of others' time); debt is only what a team's last dispatch and its under-estimated items
in flight cost, and once nothing is queued or in flight anywhere ``V`` moves to the
largest finish tag: every team starts even. Bounded memory: a request, and a team
without debt, is forgotten once nothing of it is queued or in flight; at most
``max_idle`` teams with debt are remembered (the oldest go first, even when they return).

API (items are opaque to the policy; every front-end builds on these)::

    fs = FairShare[Item](weights, dead=None)  # dead(item): skip it when popped
    fs.push(team, request, item, cost)       # cost in the service's unit; estimate is fine
    grant = fs.pop(limit=1, budget=inf)      # None: nothing queued, eligible or fitting
    fs.settle(grant, real_cost)              # exactly once per grant: it leaves flight
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Eligible = Callable[[str], bool] | None  # teams that may be served now (None: all)

MAX_IDLE_TEAMS = 4096  # teams remembered while idle with debt (see the module docstring)
MIN_COST = 1e-9  # a free item would stall virtual time: every item costs something


class _Flow:
    """A team or a request: its tags and how many of its items are queued / in flight.
    ``floor``: V when it last joined; ``seq``: when last served (ties); ``version``: heap
    entries of an older one are stale."""

    __slots__ = ("finish", "floor", "inflight", "queued", "seq", "version")

    def __init__(self) -> None:
        self.finish = self.floor = 0.0
        self.seq = self.version = self.queued = self.inflight = 0

    @property
    def start(self) -> float:
        return max(self.finish, self.floor)


class _Request(_Flow, Generic[T]):  # its queued items, each with its cost
    __slots__ = ("items", "key")

    def __init__(self, key: Hashable) -> None:
        super().__init__()
        self.key = key
        self.items: deque[tuple[T, float]] = deque()


class _Team(_Flow, Generic[T]):
    __slots__ = ("heap", "name", "requests", "vtime", "weight")

    def __init__(self, name: str, weight: float) -> None:
        super().__init__()
        self.name = name
        self.weight = weight
        self.vtime = 0.0  # the team's own virtual time, over its requests
        self.requests: dict[Hashable, _Request[T]] = {}
        self.heap: list[tuple[float, int, int, _Request[T]]] = []


@dataclass(eq=False)
class Grant(Generic[T]):
    """Items dispatched from one request, with the cost charged for them (the estimate)."""

    team: str
    request: Hashable
    items: list[T]
    cost: float
    _team: _Team[T] = field(repr=False)
    _request: _Request[T] = field(repr=False)
    settled: bool = False


def _enter(heap: list[Any], flow: _Flow, flows: int) -> None:
    """(Re-)enter ``flow`` at its current start tag; its older entries become stale (and
    go when the heap holds many more entries than its ``flows``)."""
    flow.version += 1
    heapq.heappush(heap, (flow.start, flow.seq, flow.version, flow))
    if len(heap) > 4 * flows + 64:
        heap[:] = [e for e in heap if e[3].version == e[2] and e[3].queued]
        heapq.heapify(heap)


def _moved(finish: float, delta: float, vtime: float) -> float:
    """``finish`` corrected by ``delta``; a refund takes it no lower than ``vtime``."""
    return finish + delta if delta > 0 else max(finish + delta, min(finish, vtime))


def _head(heap: list[Any]) -> Any:
    """The queued flow with the least start tag, stale entries dropped; None if none."""
    while heap:
        _, _, version, flow = heap[0]
        if flow.version == version and flow.queued:
            return flow
        heapq.heappop(heap)
    return None


class FairShare(Generic[T]):
    """Two-level start-time fair queueing (see the module docstring). Not thread-safe:
    one event loop (or one lock) owns it."""

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        *,
        dead: Callable[[T], bool] | None = None,
        max_idle: int = MAX_IDLE_TEAMS,
    ) -> None:
        self.weights = dict(weights or {})
        self.vtime = self._max_finish = 0.0  # V, and the largest F given out
        self.queued = self.inflight = 0
        self._dead = dead
        self._max_idle = max_idle
        self._teams: dict[str, _Team[T]] = {}  # queued or in flight
        self._idle: OrderedDict[str, _Team[T]] = OrderedDict()  # idle, with debt
        self._heap: list[tuple[float, int, int, _Team[T]]] = []
        self._seq = itertools.count(1)

    def push(self, team: str, request: Hashable, item: T, cost: float = 1.0, **kw: Any) -> None:
        """Queue one item of ``team``'s ``request`` (``push_many``'s keywords)."""
        self.push_many(team, request, (item,), cost, **kw)

    def push_many(
        self,
        team: str,
        request: Hashable,
        items: Iterable[T],
        cost: float = 1.0,
        *,
        weight: float | None = None,
        front: bool = False,
    ) -> None:
        """Queue ``items`` of ``team``'s ``request``, each costing ``cost`` (at its head, in
        this order, with ``front``: items handed back unrun). ``weight`` overrides the
        configured one from now on."""
        t = self._team(team, weight)
        r = t.requests.get(request)
        if r is None:
            r = t.requests[request] = _Request(request)
        entries = [(item, max(cost, MIN_COST)) for item in items]
        if not entries:
            self._forget(t, r)
            return
        if front:
            r.items.extendleft(reversed(entries))
        else:
            r.items.extend(entries)
        n = len(entries)
        self.queued += n
        r.queued += n
        t.queued += n
        # The request, and the team, join at max(F, V): history forgotten. Items handed
        # back (``front``) keep their start tag but count as served now: at an equal tag,
        # flows that joined while they were out go first (see the module docstring).
        for flow, heap, vtime, flows in (
            (r, t.heap, t.vtime, len(t.requests)),
            (t, self._heap, self.vtime, len(self._teams)),
        ):
            if flow.queued != n and not front:
                continue  # already queued: its place stands
            if flow.queued == n and not (front and flow.inflight):
                flow.floor = vtime
            if front or not flow.inflight:
                flow.seq = next(self._seq)
            _enter(heap, flow, flows)

    def _team(self, name: str, weight: float | None) -> _Team[T]:
        t = self._teams.get(name)
        if t is None:
            t = self._idle.pop(name, None)
            if t is None:
                t = _Team(name, self.weights.get(name, 1))
            self._teams[name] = t
        if weight is not None and weight > 0:
            t.weight = weight
        return t

    def _select(self, eligible: Eligible) -> tuple[_Team[T], _Request[T]] | None:
        """The team and request ``pop`` serves next (dead items at its head dropped)."""
        while True:
            skipped = []
            team: _Team[T] | None = None
            while (head := _head(self._heap)) is not None:
                if eligible is None or eligible(head.name):
                    team = head
                    break
                skipped.append(heapq.heappop(self._heap))
            for entry in skipped:
                heapq.heappush(self._heap, entry)
            if team is None:
                return None
            req: _Request[T] | None = _head(team.heap)
            assert req is not None, "a queued team has a queued request"
            if self._dead is not None:
                dead = 0
                while req.items and self._dead(req.items[0][0]):
                    req.items.popleft()
                    dead += 1
                if dead:
                    self._drop(team, req, dead)
                    continue
            return team, req

    def peek(self, eligible: Eligible = None) -> tuple[str, Hashable, T, float] | None:
        """(team, request, item, cost) that ``pop`` would take first, or None."""
        if (chosen := self._select(eligible)) is None:
            return None
        team, req = chosen
        return (team.name, req.key, *req.items[0])

    def pop(
        self,
        limit: int = 1,
        *,
        budget: float = math.inf,
        eligible: Eligible = None,
    ) -> Grant[T] | None:
        """Dispatch up to ``limit`` items in a row from the next request (costs adding up
        to at most ``budget``), charged to it and its team; None if nothing is queued,
        nothing is eligible, or the first item's cost is over ``budget``."""
        chosen = self._select(eligible)
        if chosen is None:
            return None
        team, req = chosen
        items: list[T] = []
        total = 0.0
        dead = self._dead
        while req.items and len(items) < limit:
            item, cost = req.items[0]
            if dead is not None and items and dead(item):
                req.items.popleft()
                self._drop(team, req, 1)
                continue
            if total + cost > budget:
                break
            req.items.popleft()
            items.append(item)
            total += cost
        if not items:
            return None
        n, start, rstart = len(items), team.start, req.start
        team.seq, req.seq = next(self._seq), next(self._seq)  # ties: served longest ago
        self.vtime, team.vtime = max(self.vtime, start), max(team.vtime, rstart)
        team.finish, req.finish = start + total / team.weight, rstart + total
        self._max_finish = max(self._max_finish, team.finish)
        req.queued -= n
        team.queued -= n
        self.queued -= n
        req.inflight += n
        team.inflight += n
        self.inflight += n
        if req.queued:
            _enter(team.heap, req, len(team.requests))
        if team.queued:
            _enter(self._heap, team, len(self._teams))
        return Grant(team.name, req.key, items, total, team, req)

    def settle(self, grant: Grant[T], cost: float | None = None) -> None:
        """The grant's items have run (or will not): their real total ``cost`` replaces
        the estimate (None: keep it; 0: refund, e.g. an item handed back unrun)."""
        if grant.settled:
            return
        grant.settled = True
        delta = 0.0 if cost is None else cost - grant.cost
        self._settle(grant._team, grant._request, len(grant.items), delta)

    def adjust(self, team: str, request: Hashable, delta: float, done: int = 0) -> None:
        """Charge ``delta`` more (or less) to ``team``'s ``request`` and take ``done`` of
        its items out of flight. A team forgotten meanwhile is not charged."""
        t, r = self._find(team, request)
        if t is not None:
            self._settle(t, r, done, delta)

    def _find(self, team: str, request: Hashable) -> tuple[_Team[T] | None, _Request[T] | None]:
        return (t := self._teams.get(team)), (t.requests.get(request) if t else None)

    def _settle(self, t: _Team[T], r: _Request[T] | None, done: int, delta: float) -> None:
        if delta:  # a refund stops at the virtual time: S >= V holds (module docstring)
            t.finish = _moved(t.finish, delta / t.weight, self.vtime)
            self._max_finish = max(self._max_finish, t.finish)
            if t.queued:
                _enter(self._heap, t, len(self._teams))
            if r is not None:
                r.finish = _moved(r.finish, delta, t.vtime)
                if r.queued:
                    _enter(t.heap, r, len(t.requests))
        if done:
            t.inflight -= done
            self.inflight -= done
            if r is not None:
                r.inflight -= done
                self._forget(t, r)
            elif not t.queued and not t.inflight:
                self._retire(t)
        if not self.queued and not self.inflight:
            self._drained()

    def cancel(self, team: str, request: Hashable) -> list[T]:
        """Drop ``team``'s ``request``'s queued items (its client left); they are
        returned. Its items in flight still get settled."""
        t, r = self._find(team, request)
        if t is None or r is None:
            return []
        items = [item for item, _ in r.items]
        r.items.clear()
        self._drop(t, r, len(items))
        return items

    def prune(self, team: str, request: Hashable) -> None:
        """Drop dead items (see ``dead``) from both ends of a request's queue now."""
        t, r = self._find(team, request)
        if t is None or r is None or self._dead is None:
            return
        n = 0
        while r.items and self._dead(r.items[0][0]):
            r.items.popleft()
            n += 1
        while r.items and self._dead(r.items[-1][0]):
            r.items.pop()
            n += 1
        self._drop(t, r, n)

    def _drop(self, t: _Team[T], r: _Request[T], n: int) -> None:
        """``n`` queued items of ``r`` left without running."""
        r.queued -= n
        t.queued -= n
        self.queued -= n
        self._forget(t, r)
        if not self.queued and not self.inflight:
            self._drained()

    def _forget(self, t: _Team[T], r: _Request[T]) -> None:
        if not r.queued and not r.inflight and t.requests.get(r.key) is r:
            del t.requests[r.key]
        if not t.queued and not t.inflight:
            self._retire(t)

    def _retire(self, t: _Team[T]) -> None:
        """``t`` has nothing queued or in flight: forget it, or keep its debt a while."""
        if self._teams.get(t.name) is not t:
            return
        del self._teams[t.name]
        t.heap.clear()
        t.requests.clear()
        if t.finish > self.vtime:
            self._idle[t.name] = t
            while len(self._idle) > self._max_idle:
                self._idle.popitem(last=False)

    def _drained(self) -> None:
        """Nothing queued or in flight: every team starts even from here."""
        self.vtime = max(self.vtime, self._max_finish)
        self._idle.clear()
        self._heap.clear()

    def teams(self) -> int:
        """Teams remembered (queued, in flight, or idle with debt)."""
        return len(self._teams) + len(self._idle)

    def clear(self) -> list[tuple[str, Hashable, T]]:
        """Drop every queued item (the service is shutting down); they are returned."""
        keys = [(t.name, r.key) for t in self._teams.values() for r in t.requests.values()]
        return [(team, key, item) for team, key in keys for item in self.cancel(team, key)]
