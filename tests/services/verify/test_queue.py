"""The pool's fair queue in-process: who leads a chunk, shares, requeue and cancel."""

from __future__ import annotations

from arbiter.errors import ItemResult
from arbiter.services.verify.queue import MIN_SHARE, FairQueue, Job
from arbiter.services.verify.worker import Item


def _items(tag: str, n: int) -> list[Item]:
    return [(f"{tag}{i}", "1", 1e-6, True, "") for i in range(n)]  # response, gold, tol, fast, team


def _tags(chunk: list[Job]) -> str:
    return "".join(job.item[0][0] for job in chunk)


async def test_new_request_leads_the_next_chunk() -> None:
    # A has 100 items queued and has been served; B arrives with 3: B's lead the chunk.
    q = FairQueue()
    a = q.submit(_items("a", 100))
    first = q.take(16)
    assert _tags(first) == "a" * 16
    a.add_charge(5.0)  # its items took worker time
    q.submit(_items("b", 3))
    assert _tags(q.take(16)) == "bbb" + "a" * 13
    assert q.queued == 100 - 16 - 13


async def test_least_charged_first_in_runs() -> None:
    # Three requests with plenty queued: the least charged gives a run of MIN_SHARE items
    # in a row; once its items have cost as much as the next one's charge, that one leads.
    q = FairQueue()
    a, b, c = (q.submit(_items(t, 40)) for t in "abc")
    for ticket, seconds in ((a, 3.0), (b, 1.0), (c, 2.0)):
        ticket.add_charge(seconds)
    run = q.take(MIN_SHARE)
    assert _tags(run) == "b" * MIN_SHARE
    for job in run:  # b's run took 1.5 s: b is now charged 2.5, past c's 2
        job.ticket.add_charge(1.5 / MIN_SHARE)
        job.ticket.answer(job.pos, (ItemResult(1.0), "fast_path", None))
    assert _tags(q.take(MIN_SHARE)) == "c" * MIN_SHARE


async def test_requeue_keeps_order_and_cancel_drops() -> None:
    q = FairQueue()
    a = q.submit(_items("a", 10))
    chunk = q.take(10)
    q.requeue(chunk[4:])  # handed back after 4
    again = q.take(10)
    assert [j.item[0] for j in again] == [f"a{i}" for i in range(4, 10)]
    b = q.submit(_items("b", 5))
    q.cancel(b)
    assert q.queued == 0 and b.cancelled and b.done.cancelled()
    q.requeue(again)
    q.cancel(a)
    assert q.take(10) == [] and q.queued == 0


async def test_one_future_per_request_resolves_with_the_last_result() -> None:
    q = FairQueue()
    t = q.submit(_items("a", 3))
    for job in q.take(3):
        assert not t.done.done()
        t.answer(job.pos, (ItemResult(1.0), "fast_path", None))
    assert t.done.done() and t.left == 0
    t.answer(0, (ItemResult(0.0), "fast_path", None))  # a late duplicate does not count
    assert [r[0].score for r in t.results if r] == [1.0, 1.0, 1.0]
    assert q.submit([]).done.done()  # nothing to wait for


def _teams(chunk: list[Job]) -> str:
    return "".join(job.ticket.team for job in chunk)


async def test_another_team_leads_the_next_chunk_whatever_one_team_queued() -> None:
    # Team a sends 70 requests of 6 items at once (one sample per POST, as OpenRLHF and
    # slime do); team b's one item, queued after all of them, leads the next chunk. Shared
    # per request only, b's item came after a's 70 requests: 420 items.
    q = FairQueue()
    for _ in range(70):
        q.submit(_items("a", 6), team="a")
    served = q.take(16)
    for job in served:
        job.ticket.add_charge(0.05)  # a's items took worker time
    q.submit(_items("b", 1), team="b")
    assert _tags(q.take(128)) == "b" + "a" * 127


async def test_a_team_queued_before_any_chunk_shares_the_first_one() -> None:
    # b arrives while a's 70 requests are queued and none has run yet: a came first; b's
    # items follow one run of a's (its first request's 6 items), not a's 420 items.
    q = FairQueue()
    for _ in range(70):
        q.submit(_items("a", 6), team="a")
    q.submit(_items("b", 2), team="b")
    assert _teams(q.take(128)) == "a" * 6 + "bb" + "a" * 120


def _serve(q: FairQueue, takes: int, n: int) -> dict[str, int]:
    """Take ``takes`` chunks of ``n``, each item taking one second of worker time (as the
    pool charges and answers it); items taken per team."""
    count: dict[str, int] = {}
    for _ in range(takes):
        for job in q.take(n):
            job.ticket.add_charge(1.0)
            job.ticket.answer(job.pos, (ItemResult(1.0), "fast_path", None))
            count[job.ticket.team] = count.get(job.ticket.team, 0) + 1
    return count


async def test_weights_share_the_pool_in_proportion() -> None:
    # VERIFY_TEAM_WEIGHTS={"a": 2}: with both teams always queued, a gets twice b's items.
    q = FairQueue(weights={"a": 2})
    q.submit(_items("a", 4000), team="a")
    q.submit(_items("b", 4000), team="b")
    count = _serve(q, 60, MIN_SHARE)
    assert 1.8 <= count["a"] / count["b"] <= 2.2, count


async def test_a_team_back_from_idle_does_not_take_the_pool_over() -> None:
    # a ran alone for a long time (400 s of worker time); c joins with a large backlog.
    # c starts at the virtual time a reached, not at 0: they alternate at once (within
    # SFQ's bound, one run of each) instead of c holding the pool for 400 s of items.
    q = FairQueue()
    q.submit(_items("a", 4000), team="a")
    _serve(q, 50, MIN_SHARE)
    q.submit(_items("c", 4000), team="c")
    count = _serve(q, 10, MIN_SHARE)
    assert abs(count["a"] - count["c"]) <= 2 * MIN_SHARE, count


async def test_inside_a_team_its_new_request_leads_its_share() -> None:
    # The team's own requests are still shared fairly: a's second request leads a's share.
    q = FairQueue()
    first = q.submit(_items("a", 100), team="a")
    q.take(16)
    first.add_charge(5.0)
    q.submit(_items("n", 3), team="a")
    assert _tags(q.take(16)) == "nnn" + "a" * 13
