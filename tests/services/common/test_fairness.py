"""FairLimiter: the bound holds, waiters are admitted fairly across teams, then across
each team's keys (weighted per team), and cancelled waiters neither block the line nor
leak a slot. The policy itself is tested in test_fairshare.py."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from arbiter.proto.common import TEAM_HEADER
from arbiter.services.common.fairness import ANONYMOUS, MAX_TEAM_CHARS, FairLimiter, team_of


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


async def _hold_team(
    limiter: FairLimiter, team: str, key: str, log: list[str], gate: asyncio.Event
) -> None:
    async with limiter.slot(key, team):
        log.append(team)
        await gate.wait()


async def test_another_teams_request_is_admitted_next_whatever_one_team_queued() -> None:
    # Team a queues 70 requests of 6 waiters each (one sample per POST, as OpenRLHF and
    # slime send); team b's one waiter, queued after all 420, is admitted as soon as a
    # slot frees: one of a's before it, at most. Per request alone it waited for 70.
    limiter = FairLimiter(2)
    log: list[str] = []
    gate = asyncio.Event()
    async with limiter.slot("first", "a"), limiter.slot("second", "a"):  # both slots held
        tasks = [
            asyncio.create_task(_hold_team(limiter, "a", f"a{r}", log, gate))
            for r in range(70)
            for _ in range(6)
        ]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(_hold_team(limiter, "b", "b0", log, gate)))
        await asyncio.sleep(0)
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*tasks)
    assert log.index("b") <= 1, log.index("b")
    assert len(log) == 421 and limiter.held == 0 and limiter.waiting == 0


async def test_inside_a_team_requests_take_turns() -> None:
    # The per-request round-robin still holds inside one team.
    limiter = FairLimiter(1)
    log: list[str] = []
    gate = asyncio.Event()
    gate.set()
    async with limiter.slot("h", "t"):
        tasks = [asyncio.create_task(_hold(limiter, "x", log, gate)) for _ in range(3)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(_hold(limiter, "y", log, gate)))
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert log == ["x", "y", "x", "x"]


async def test_weighted_teams_get_slots_in_proportion() -> None:
    # weights {"a": 3}: while both wait a gets three slots for each of b's, and b never
    # waits for more than four of a's in a row (SFQ's bound: one item of each, by weight).
    limiter = FairLimiter(1, weights={"a": 3})
    log: list[str] = []
    gate = asyncio.Event()
    gate.set()
    async with limiter.slot("h", "h"):
        tasks = [
            asyncio.create_task(_hold_team(limiter, t, f"{t}{i}", log, gate))
            for t in "ab"
            for i in range(12)
        ]
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    order = "".join(log[:12])
    assert order.count("a") == 9 and "aaaaa" not in order, order


def test_team_is_read_from_the_gateways_header() -> None:
    # The route's team: the internal header the gateway sets, cut to MAX_TEAM_CHARS;
    # without it, the one anonymous team.
    def request(headers: list[tuple[bytes, bytes]]) -> Request:
        return Request({"type": "http", "headers": headers, "method": "POST", "path": "/"})

    header = TEAM_HEADER.lower().encode()
    assert team_of(request([(header, b"rl-core")])) == "rl-core"
    assert team_of(request([])) == ANONYMOUS
    assert team_of(request([(header, b"x" * 1000)])) == "x" * MAX_TEAM_CHARS
