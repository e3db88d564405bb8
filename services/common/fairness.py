"""A concurrency bound that is fair across requests: waiters are admitted round-robin.

``asyncio.Semaphore`` admits waiters first come, first served: a request of 1,000 items
queues 1,000 waiters, and the next request's items wait behind all of them. Here each
waiter names its key (its request); when a slot frees, it goes to the next key in turn,
and that key, if it still has waiters, goes to the back of the line. So a request waits
for at most one slot to free per request ahead of it, however many items those sent.

A waiter that is cancelled (its request's client went away) leaves the line; one that
was admitted and then cancelled hands its slot on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Hashable


class FairLimiter:
    """At most ``limit`` holders at once; waiters admitted round-robin across keys."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self._held = 0
        # key -> its waiters; the dict's order is the turn order
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}

    @property
    def held(self) -> int:
        return self._held

    @property
    def waiting(self) -> int:
        return sum(1 for q in self._waiting.values() for f in q if not f.done())

    @contextlib.asynccontextmanager
    async def slot(self, key: Hashable) -> AsyncIterator[None]:
        """Hold one of the ``limit`` slots, waiting for ``key``'s turn if all are taken."""
        await self._acquire(key)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, key: Hashable) -> None:
        if self._held < self.limit and not self._waiting:
            self._held += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(fut)
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
        while self._held < self.limit and self._waiting:
            key = next(iter(self._waiting))
            line = self._waiting.pop(key)
            while line and line[0].done():  # cancelled while waiting
                line.popleft()
            if not line:
                continue
            fut = line.popleft()
            if line:
                self._waiting[key] = line  # back of the line: the others go first
            self._held += 1
            fut.set_result(None)
