"""The fair-share policy (``common.fairshare``): the one guarantee every queue builds on.

A team that joins waits for at most one dispatch per other team, whatever those teams
queued or were served before; weights scale shares; a team's history neither helps nor
hurts it after it has been idle; cancelled and dead items never run; memory stays bounded.
The front-ends (limiter, gateway slots, verify's queue, the embedding batcher) have their
own small tests beside their modules.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from arbiter.services.common.fairshare import FairShare, Grant

Served = list[tuple[str, str, float]]  # (team, request, cost) in dispatch order


def _serve(fs: FairShare[str], n: int | None = None, real: float | None = None) -> Served:
    """Pop (and settle, at ``real`` per item or the estimate) until empty or ``n`` pops."""
    out: Served = []
    while n is None or len(out) < n:
        grant = fs.pop()
        if grant is None:
            break
        cost = grant.cost if real is None else real * len(grant.items)
        fs.settle(grant, cost)
        out.append((grant.team, str(grant.request), cost))
    return out


@dataclass
class Case:
    why: str
    # served to completion before the test, one team at a time: (team, items, cost each)
    history: list[tuple[str, int, float]] = field(default_factory=list)
    # then queued in this order: (team, request, items, cost each)
    queued: list[tuple[str, str, int, float]] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    # one item of this team stays in flight throughout: the policy never drains, so
    # history is not wiped by the drain rule and the virtual time alone must carry it
    busy: bool = False
    check: Callable[[Served], None] = lambda served: None


def _position(served: Served, team: str) -> int:
    return next(i for i, (t, _, _) in enumerate(served) if t == team)


def _victim_waits_one_item_per_other_team(served: Served) -> None:
    ahead = served[: _position(served, "veteran")]
    assert len(ahead) <= 1, ahead  # one other team queued: at most one of its items
    assert sum(cost for *_, cost in ahead) <= 5.0  # one slow item's cost


def _alternate(served: Served) -> None:
    teams = [t for t, _, _ in served[:20]]
    assert abs(teams.count("back") - teams.count("stayed")) <= 2, teams


def _shares(want: dict[str, float], window: int = 400) -> Callable[[Served], None]:
    def check(served: Served) -> None:
        work: dict[str, float] = {}
        for team, _, cost in served[:window]:
            work[team] = work.get(team, 0.0) + cost
        base = min(want, key=lambda t: want[t])
        for team, share in want.items():
            ratio = work[team] / work[base]
            assert abs(ratio - share / want[base]) <= 0.05 * share, (work, want)

    return check


def _requests_take_turns(served: Served) -> None:
    assert [r for _, r, _ in served[:6]] == ["x", "y", "z", "x", "y", "z"], served


def _newest_of_many_within_one_round(served: Served) -> None:
    assert _position(served, "new") <= 100, _position(served, "new")


CASES = [
    Case(
        # The reported starvation: the main job used the queue for an hour, then sends one
        # response while a newcomer queues 15 requests of 8 slow LaTeX answers.
        why="veteran_after_drain",
        history=[("veteran", 1000, 1.0)],
        queued=[*[("newcomer", f"n{r}", 8, 5.0) for r in range(15)], ("veteran", "v", 1, 1.0)],
        check=_victim_waits_one_item_per_other_team,
    ),
    Case(
        # The same while the pool never drains (another team's item runs throughout): the
        # global virtual time, not the drain, is what puts the veteran level again.
        why="veteran_never_drained",
        history=[("veteran", 1000, 1.0)],
        queued=[*[("newcomer", f"n{r}", 8, 5.0) for r in range(15)], ("veteran", "v", 1, 1.0)],
        busy=True,
        check=_victim_waits_one_item_per_other_team,
    ),
    Case(
        # Credit does not pile up either: a team back after others ran 500 items does not
        # get 500 items in a row; it alternates with the team that stayed.
        why="idle_then_return",
        history=[("back", 10, 1.0), ("stayed", 500, 1.0)],
        queued=[("stayed", "s", 100, 1.0), ("back", "b", 100, 1.0)],
        busy=True,
        check=_alternate,
    ),
    Case(
        # Weights scale work: weight 3 gets three times the items of weight 1.
        why="weights",
        queued=[("heavy", "h", 1000, 1.0), ("light", "l", 1000, 1.0)],
        weights={"heavy": 3},
        check=_shares({"heavy": 3, "light": 1}),
    ),
    Case(
        # Shares are of cost, not items: equal weights, items twice as expensive, half as
        # many of them.
        why="cost_not_items",
        queued=[("slow", "s", 1000, 2.0), ("fast", "f", 1000, 1.0)],
        check=_shares({"slow": 1, "fast": 1}),
    ),
    Case(
        # Inside a team its requests take turns, whatever order their items came in.
        why="requests_take_turns",
        queued=[("t", "x", 10, 1.0), ("t", "y", 10, 1.0), ("t", "z", 10, 1.0)],
        check=_requests_take_turns,
    ),
    Case(
        # Many teams: a team that joins behind 100 teams of 50 items each is served
        # within one item of each of them.
        why="many_teams",
        queued=[*[(f"t{i}", "r", 50, 1.0) for i in range(100)], ("new", "r", 1, 1.0)],
        check=_newest_of_many_within_one_round,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.why for c in CASES])
def test_policy(case: Case) -> None:
    fs: FairShare[str] = FairShare(case.weights)
    if case.busy:
        fs.push("bystander", "b", "held", 1.0)
        held = fs.pop()
        assert held is not None
    for team, n, cost in case.history:
        fs.push_many(team, "history", [f"h{i}" for i in range(n)], cost)
        _serve(fs)
    for team, request, n, cost in case.queued:
        fs.push_many(team, request, [f"{request}{i}" for i in range(n)], cost)
    served = _serve(fs)
    assert fs.queued == 0 and len(served) == sum(n for _, _, n, _ in case.queued)
    case.check(served)


def test_estimates_are_corrected_when_the_real_cost_is_known() -> None:
    # a's items are estimated at 1 but take 10: once settled, b gets ten of its honest
    # items for each of a's.
    fs: FairShare[str] = FairShare()
    fs.push_many("a", "r", [f"a{i}" for i in range(100)], 1.0)
    fs.push_many("b", "r", [f"b{i}" for i in range(1000)], 1.0)
    count = {"a": 0, "b": 0}
    for _ in range(220):
        grant = fs.pop()
        assert grant is not None
        fs.settle(grant, 10.0 if grant.team == "a" else 1.0)
        count[grant.team] += 1
    assert 9 <= count["b"] / count["a"] <= 11, count


def test_cancel_drops_a_requests_queued_items_only() -> None:
    fs: FairShare[str] = FairShare()
    fs.push_many("a", "gone", ["g1", "g2", "g3"])
    fs.push_many("a", "kept", ["k1"])
    running = fs.pop()
    assert running is not None and running.items == ["g1"]
    assert fs.cancel("a", "gone") == ["g2", "g3"]
    assert [str(r) for _, r, _ in _serve(fs)] == ["kept"]
    assert fs.teams() == 1  # "gone"'s item still runs
    fs.settle(running)
    assert fs.teams() == 0 and fs.queued == 0 and fs.inflight == 0
    assert fs.cancel("a", "gone") == [] and fs.cancel("nobody", "r") == []


def test_dead_items_are_skipped_and_pruned() -> None:
    # A waiter that left (its client went away) is never dispatched nor charged.
    gone: set[str] = {"x1", "x3"}
    fs: FairShare[str] = FairShare(dead=lambda item: item in gone)
    fs.push_many("a", "x", ["x1", "x2", "x3"])
    fs.prune("a", "x")  # both ends: x1 and x3
    assert fs.queued == 1
    gone.add("x2")
    assert fs.pop() is None and fs.queued == 0 and fs.teams() == 0


def test_runs_limit_budget_and_eligibility() -> None:
    fs: FairShare[str] = FairShare()
    fs.push_many("a", "r", ["a1", "a2", "a3"], 2.0)
    fs.push_many("b", "r", ["b1"], 1.0)
    assert fs.peek() == ("a", "r", "a1", 2.0)
    assert fs.pop(limit=2, budget=1.5) is None  # the first item alone is over the budget
    run = fs.pop(limit=3, budget=5.0)  # two items fit the budget
    assert run is not None and run.items == ["a1", "a2"] and run.cost == 4.0
    only_a = fs.pop(eligible=lambda team: team == "a")  # b is capped: a's turn again
    assert only_a is not None and only_a.items == ["a3"]
    last = fs.pop()
    assert last is not None and last.items == ["b1"]


def test_memory_is_bounded_for_forgotten_teams() -> None:
    # 10,000 one-off teams: none is remembered once its work is settled; with debt
    # (items that cost more than estimated while others kept the queue busy) at most
    # max_idle are.
    fs: FairShare[str] = FairShare(max_idle=50)
    fs.push("bystander", "b", "held")
    held = fs.pop()
    assert held is not None
    for i in range(10_000):
        fs.push(f"t{i}", "r", "x", 1.0)
        grant = fs.pop()
        assert grant is not None
        fs.settle(grant, 1.0 if i % 2 else 100.0)  # every other one is in debt
    assert fs.teams() <= 1 + 50
    fs.settle(held)
    assert fs.teams() == 0


def test_virtual_time_never_goes_back() -> None:
    rng = random.Random(7)
    fs: FairShare[str] = FairShare({"w": 4})
    running: list[Grant[str]] = []
    seen = 0.0
    for step in range(5000):
        action = rng.random()
        team = rng.choice("abcdw")
        if action < 0.45:
            fs.push(team, rng.randrange(4), f"i{step}", rng.choice((0.5, 1.0, 7.0)))
        elif action < 0.8 and (grant := fs.pop(limit=rng.randint(1, 3))) is not None:
            running.append(grant)
        elif action < 0.95 and running:
            fs.settle(running.pop(rng.randrange(len(running))), rng.uniform(0, 10))
        else:
            fs.cancel(team, rng.randrange(4))
        assert fs.vtime >= seen
        seen = fs.vtime
        assert fs.queued >= 0 and fs.inflight == sum(len(g.items) for g in running)


def test_refunds_stop_at_the_virtual_time() -> None:
    # A team's items were estimated far above what they cost (or handed back unrun): the
    # refund gives it no credit past the virtual time, so a team that joined meanwhile
    # still waits for at most one of its items.
    fs: FairShare[str] = FairShare()
    fs.push_many("over", "r", [f"o{i}" for i in range(40)], 1.0)
    running = [fs.pop() for _ in range(4)]
    fs.push("joined", "r", "j", 1.0)
    for grant in running:
        assert grant is not None
        fs.settle(grant, 0.01)
    assert _position(_serve(fs), "joined") <= 1


def test_items_handed_back_lose_the_tie_to_a_team_that_joined_meanwhile() -> None:
    # A worker was sent 16 slow items ahead (pipelined, each estimated 0.75), ran one for
    # 4 s, then handed the other 15 back unrun because another team had joined. The refund
    # takes the team back to the virtual time, level with the team that joined: that team
    # goes first, or it would wait behind one more slow item after the one already run.
    fs: FairShare[str] = FairShare()
    fs.push_many("newcomer", "r", [f"n{i}" for i in range(16)], 0.75)
    sent = [fs.pop() for _ in range(16)]
    fs.push("veteran", "v", "v0", 0.75)
    first, *back = sent
    assert first is not None
    fs.settle(first, 4.0)
    for grant in back:
        assert grant is not None
        fs.push(grant.team, grant.request, grant.items[0], 0.75, front=True)
        fs.settle(grant, 0.0)
    assert [team for team, _, _ in _serve(fs, 2)] == ["veteran", "newcomer"]
