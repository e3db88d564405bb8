"""FairLimiter: the bound holds, waiters are admitted round-robin across keys, and
cancelled waiters neither block the line nor leak a slot."""

from __future__ import annotations

import asyncio

import pytest

from arbiter.services.common.fairness import FairLimiter


async def _hold(limiter: FairLimiter, key: str, log: list[str], gate: asyncio.Event) -> None:
    async with limiter.slot(key):
        log.append(key)
        await gate.wait()


async def test_round_robin_across_keys() -> None:
    limiter = FairLimiter(1)
    log: list[str] = []
    gate = asyncio.Event()
    gate.set()
    async with limiter.slot("first"):  # everything below queues behind this
        tasks = [asyncio.create_task(_hold(limiter, "a", log, gate)) for _ in range(5)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(_hold(limiter, "b", log, gate)) for _ in range(2)]
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    # a's five waiters queued first, yet b's two are admitted in turn with them
    assert log == ["a", "b", "a", "b", "a", "a", "a"]
    assert limiter.held == 0


async def test_bound_holds() -> None:
    limiter = FairLimiter(3)
    peak = 0

    async def work(key: str) -> None:
        nonlocal peak
        async with limiter.slot(key):
            peak = max(peak, limiter.held)
            await asyncio.sleep(0.001)

    await asyncio.gather(*(work(f"k{i % 4}") for i in range(40)))
    assert peak == 3 and limiter.held == 0


async def test_cancelled_waiters_leave_no_trace() -> None:
    limiter = FairLimiter(1)
    log: list[str] = []
    gate = asyncio.Event()
    holder = asyncio.create_task(_hold(limiter, "h", log, gate))
    await asyncio.sleep(0)
    gone = [asyncio.create_task(_hold(limiter, "gone", log, gate)) for _ in range(3)]
    await asyncio.sleep(0)
    for t in gone:
        t.cancel()
    kept = asyncio.create_task(_hold(limiter, "kept", log, gate))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(holder, kept)
    assert log == ["h", "kept"]
    assert limiter.held == 0 and limiter.waiting == 0


async def test_admitted_then_cancelled_hands_the_slot_on() -> None:
    limiter = FairLimiter(1)
    log: list[str] = []
    gate = asyncio.Event()
    gate.set()
    async with limiter.slot("h"):
        first = asyncio.create_task(_hold(limiter, "first", log, gate))
        second = asyncio.create_task(_hold(limiter, "second", log, gate))
        await asyncio.sleep(0)
    first.cancel()  # admitted on release, cancelled before it ran
    await asyncio.gather(second)
    assert log == ["second"] and limiter.held == 0


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairLimiter(0)
