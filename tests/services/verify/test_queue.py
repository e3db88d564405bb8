"""The pool's fair queue in-process: who leads a chunk, shares, requeue and cancel."""

from __future__ import annotations

from arbiter.errors import ItemResult
from arbiter.services.verify.queue import MIN_SHARE, FairQueue, Job


def _items(tag: str, n: int) -> list[tuple[str, str, float, bool]]:
    return [(f"{tag}{i}", "1", 1e-6, True) for i in range(n)]  # response, gold, tol, fast


def _tags(chunk: list[Job]) -> str:
    return "".join(job.item[0][0] for job in chunk)


async def test_new_request_leads_the_next_chunk() -> None:
    # A has 100 items queued and has been served; B arrives with 3: B's lead the chunk.
    q = FairQueue()
    a = q.submit(_items("a", 100))
    first = q.take(16)
    assert _tags(first) == "a" * 16
    a.charge += 5.0  # its items took worker time
    q.submit(_items("b", 3))
    assert _tags(q.take(16)) == "bbb" + "a" * 13
    assert q.queued == 100 - 16 - 13


async def test_least_charged_first_and_shares() -> None:
    # Three requests with plenty queued: each gives its share, the least charged first;
    # a share is at least MIN_SHARE items in a row.
    q = FairQueue()
    a, b, c = (q.submit(_items(t, 40)) for t in "abc")
    a.charge, b.charge, c.charge = 3.0, 1.0, 2.0
    chunk = q.take(3 * MIN_SHARE)
    assert _tags(chunk) == "b" * MIN_SHARE + "c" * MIN_SHARE + "a" * MIN_SHARE


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
