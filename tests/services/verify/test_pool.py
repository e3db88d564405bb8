"""The worker pool in-process, with real worker processes: two chunks in flight per worker.

A worker is sent its next chunk while it runs the current one; these tests check that
nothing is lost or blamed wrongly when the worker is killed with both in its socket: the
deadline of an item in the second chunk runs from when it starts, and a worker killed from
outside answers only its running item and gives the rest back to the queue.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest

from arbiter.services.verify.pool import DEPTH, YIELDS, WorkerPool
from arbiter.services.verify.queue import MIN_SHARE
from arbiter.services.verify.worker import Item

STUCK = "\\boxed{7^{123456789}}"  # math-verify evaluates it: holds a worker until killed
DEADLINE_S = 1.5


def _quick(n: int) -> list[Item]:
    return [(f"<answer>{i}</answer>", str(i), 1e-6, False, "") for i in range(n)]


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    # One worker, chunks of 8 (the queue's smallest share), math-verify's own timeout far
    # above the deadline: the wall-clock kill is what answers a stuck item.
    p = WorkerPool(size=1, deadline_s=DEADLINE_S, mv_timeout_s=60, max_chunk=MIN_SHARE)
    await p.start()
    yield p
    await p.close()


async def test_next_chunk_is_sent_while_one_runs(pool: WorkerPool) -> None:
    n = (DEPTH + 2) * MIN_SHARE
    ticket = pool.submit(_quick(n))
    worker = pool._workers[0]
    assert worker is not None and len(worker.inflight) == DEPTH and pool.queued == 2 * MIN_SHARE
    await asyncio.wait_for(ticket.done, 30)
    assert [r[0].score for r in ticket.results if r] == [1.0] * n


async def test_deadline_of_an_item_in_the_second_chunk_runs_from_its_start(
    pool: WorkerPool,
) -> None:
    n, stuck = 3 * MIN_SHARE, MIN_SHARE + 1  # the second chunk's second item
    items = _quick(n)
    items[stuck] = (STUCK, "5", 1e-6, False, "")
    start = time.monotonic()
    ticket = pool.submit(items)
    await asyncio.wait_for(ticket.done, 30)
    took = time.monotonic() - start
    results = [r for r in ticket.results if r is not None]
    assert len(results) == n
    assert results[stuck][0].score is None and results[stuck][0].kind == "timeout"
    assert [r[0].score for i, r in enumerate(results) if i != stuck] == [1.0] * (n - 1)
    assert pool.restarts == 1
    assert DEADLINE_S <= took < DEADLINE_S + 10


async def test_worker_killed_with_two_chunks_in_flight_loses_nothing(pool: WorkerPool) -> None:
    items = [(STUCK, "5", 1e-6, False, ""), *_quick(2 * MIN_SHARE - 1)]
    ticket = pool.submit(items)
    worker = pool._workers[0]
    assert worker is not None and len(worker.inflight) == 2
    await asyncio.sleep(0.3)  # the stuck item is running
    worker.proc.kill()
    await asyncio.wait_for(ticket.done, 30)
    results = [r for r in ticket.results if r is not None]
    assert len(results) == 2 * MIN_SHARE
    assert results[0][0].kind == "internal" and "died" in results[0][0].message
    assert [r[0].score for r in results[1:]] == [1.0] * (2 * MIN_SHARE - 1)  # given back
    assert pool.restarts == 1


async def test_cancel_stops_the_chunk_sent_behind(pool: WorkerPool) -> None:
    # A holds the worker with a stuck item; B's items wait in the chunk sent behind it.
    a = pool.submit([(STUCK, "5", 1e-6, False, ""), *_quick(MIN_SHARE - 1)])
    b = pool.submit(_quick(MIN_SHARE))
    worker = pool._workers[0]
    assert worker is not None and len(worker.inflight) == 2
    pool.cancel(b)
    pool.cancel(a)
    assert pool.queued == 0 and a.cancelled and b.cancelled
    await asyncio.sleep(DEADLINE_S + 3)  # the stuck item meets its deadline; nothing else runs
    assert not any(b.results) and pool.alive == 1


async def test_workers_run_below_the_event_loop() -> None:
    p = WorkerPool(size=1, deadline_s=DEADLINE_S, mv_timeout_s=5, nice=7)
    await p.start()
    try:
        worker = p._workers[0]
        assert worker is not None and worker.proc.pid is not None
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, worker.proc.pid) == min(19, mine + 7)
    finally:
        await p.close()


async def test_yields_only_when_another_request_waits() -> None:
    # Chunks of one request queued behind each other are not handed back (it would only
    # re-send them); another request's chunk behind the running one is.
    p = WorkerPool(size=1, deadline_s=DEADLINE_S, mv_timeout_s=5, max_chunk=4 * MIN_SHARE,
                   yield_after_s=0.002)  # fmt: skip
    await p.start()
    try:
        before = YIELDS._value.get()
        alone = p.submit(_quick(DEPTH * 4 * MIN_SHARE))
        await asyncio.wait_for(alone.done, 60)
        assert YIELDS._value.get() == before
        first = p.submit(_quick(4 * MIN_SHARE))
        second = p.submit(_quick(MIN_SHARE))  # sent behind the first's chunk
        await asyncio.wait_for(asyncio.gather(first.done, second.done), 60)
        assert YIELDS._value.get() > before
        assert all(r is not None and r[0].score == 1.0 for r in first.results + second.results)
    finally:
        await p.close()


def _slow(n: int) -> list[Item]:
    # math-verify proves each identity: tens of milliseconds each, more than the pool's
    # 50 ms yield interval over a chunk of 8
    text = "<answer>\\sin^2(x+{i})+\\cos^2(x+{i})</answer>"
    return [(text.format(i=i), "1", 1e-6, False, "") for i in range(n)]


async def test_a_request_sent_behind_another_is_not_starved(pool: WorkerPool) -> None:
    # A's chunks fill part of the worker's pipeline, B's chunk is sent behind them. When A's
    # running chunk yields, the chunks behind it come back before the worker gets more:
    # B leads the next chunk instead of being sent behind A's items again, and again.
    a = pool.submit(_slow(3 * MIN_SHARE))
    b = pool.submit(_quick(MIN_SHARE))
    worker = pool._workers[0]
    assert worker is not None and len(worker.inflight) == 4
    await asyncio.wait_for(b.done, 30)
    a_answered = sum(r is not None for r in a.results)
    assert a_answered < len(a.results) // 2, f"B waited for {a_answered} of A's items"
    await asyncio.wait_for(a.done, 60)
    assert all(r is not None and r[0].score == 1.0 for r in a.results + b.results)


async def test_a_worker_dead_before_its_chunk_started_is_not_blamed(pool: WorkerPool) -> None:
    worker = pool._workers[0]
    assert worker is not None
    worker.proc.kill()  # dies idle; the pool has not read its EOF yet when B is sent
    ticket = pool.submit(_quick(2 * MIN_SHARE))
    await asyncio.wait_for(ticket.done, 30)
    assert [r[0].score for r in ticket.results if r] == [1.0] * 2 * MIN_SHARE


async def test_another_teams_item_runs_after_at_most_the_running_items(pool: WorkerPool) -> None:
    # Team a sends 70 requests of 6 slow items at once (one sample per POST, as OpenRLHF
    # does); team b's one item, sent while a's run, waits for the chunk running then to be
    # handed back (50 ms, plus its current item), not for a's queued items. Counted in a's
    # items answered between b's submit and b's answer; shared per request only, b's item
    # came after all 420 of a's (10.8 s measured over HTTP).
    a = [pool.submit(_slow(6), "a") for _ in range(70)]
    await asyncio.sleep(0.3)  # a's items are running
    answered = lambda: sum(r is not None for t in a for r in t.results)  # noqa: E731
    before = answered()
    b = pool.submit(_quick(1), "b")
    await asyncio.wait_for(b.done, 30)
    ran = answered() - before
    assert b.results[0] is not None and b.results[0][0].score == 1.0
    assert ran <= MIN_SHARE, f"b's item waited for {ran} of a's items"
    assert answered() < 6 * 70 // 2  # a is far from done: b did not wait for it
    for t in a:
        pool.cancel(t)
