"""``TeamSlots``: the gateway's fan-out slots of one component service, shared across
teams first (a team holds at most its share), then across each team's requests (the
policy itself: test_fairshare.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import pytest

from arbiter.services.scoring.slots import TeamSlots


async def _order(slots: TeamSlots, waiters: list[tuple[str, Hashable, int]]) -> list[str]:
    """Hold every slot, queue ``waiters`` (team, request, weight) in order, then free the
    slots one at a time: the order in which the waiters got one."""
    got: list[str] = []
    gate = asyncio.Event()
    held = asyncio.Event()
    holding = 0

    async def hold() -> None:
        nonlocal holding
        async with slots.slot("holder", "h"):
            holding += 1
            if holding == slots.limit:
                held.set()
            await gate.wait()

    async def wait(team: str, request: Hashable, weight: int) -> None:
        async with slots.slot(team, request, weight):
            got.append(f"{team}/{request}")

    holders = [asyncio.create_task(hold()) for _ in range(slots.limit)]
    await held.wait()
    tasks = []
    for team, request, weight in waiters:
        tasks.append(asyncio.create_task(wait(team, request, weight)))
        await asyncio.sleep(0)  # queued in this order
    gate.set()
    await asyncio.gather(*holders, *tasks)
    return got


ORDER_CASES = [
    # across teams first: A's three requests do not go before B's one
    ([("A", 1, 1), ("A", 2, 1), ("A", 3, 1), ("B", 1, 1)], ["A/1", "B/1", "A/2", "A/3"]),
    # then across a team's requests: A's request 1 with three calls alternates with request 2
    ([("A", 1, 1), ("A", 1, 1), ("A", 1, 1), ("A", 2, 1)], ["A/1", "A/2", "A/1", "A/1"]),
    # a team of weight 2 is charged half a slot-use per call (A/1 and A/2 cost A what B/1
    # costs B); B, joining, waits for one of A's; ties go to the team served longest ago
    (
        [("A", 1, 2), ("A", 2, 2), ("A", 3, 2), ("B", 1, 1), ("B", 2, 1)],
        ["A/1", "B/1", "A/2", "B/2", "A/3"],
    ),
]


@pytest.mark.parametrize(("waiters", "want"), ORDER_CASES)
async def test_freed_slots_go_round_robin(
    waiters: list[tuple[str, Hashable, int]], want: list[str]
) -> None:
    assert await _order(TeamSlots(limit=1, per_team=1), waiters) == want


async def test_one_team_never_holds_more_than_its_share() -> None:
    slots = TeamSlots(limit=4, per_team=2)
    gate = asyncio.Event()
    peak = 0

    async def one(team: str) -> None:
        nonlocal peak
        async with slots.slot(team, object()):
            peak = max(peak, slots.held_by(team))
            await gate.wait()

    hogs = [asyncio.create_task(one("A")) for _ in range(10)]
    await asyncio.sleep(0.01)
    assert slots.held == 2  # A has its share; two slots stay free for others
    other = asyncio.create_task(one("B"))
    await asyncio.sleep(0.01)
    assert slots.held_by("B") == 1  # at once, not behind A's eight waiters
    gate.set()
    await asyncio.gather(*hogs, other)
    assert peak == 2 and slots.held == 0


async def test_a_cancelled_waiter_leaves_and_an_admitted_one_hands_on() -> None:
    slots = TeamSlots(limit=1, per_team=1)
    gate = asyncio.Event()
    order: list[str] = []

    async def one(name: str) -> None:
        async with slots.slot(name, name):
            order.append(name)
            await gate.wait()

    first = asyncio.create_task(one("a"))
    await asyncio.sleep(0)
    gone = asyncio.create_task(one("b"))
    last = asyncio.create_task(one("c"))
    await asyncio.sleep(0)
    gone.cancel()  # its client left while it waited
    gate.set()
    await asyncio.gather(first, last)
    assert order == ["a", "c"] and slots.held == 0
    with pytest.raises(asyncio.CancelledError):
        await gone


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="per_team <= limit"):
        TeamSlots(limit=2, per_team=3)
