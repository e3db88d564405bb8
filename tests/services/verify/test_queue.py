"""The pool's fair queue in-process: who leads a chunk, shares, requeue and cancel."""

from __future__ import annotations

from arbiter.services.verify.queue import MIN_SHARE, FairQueue, Job


def _items(tag: str, n: int) -> list[tuple[str, str, float, bool]]:
    return [("1", f"{tag}{i}", 1e-6, False) for i in range(n)]


def _tags(chunk: list[Job]) -> str:
    return "".join(job.item[1][0] for job in chunk)


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
    assert [j.item[1] for j in again] == [f"a{i}" for i in range(4, 10)]
    b = q.submit(_items("b", 5))
    q.cancel(b)
    assert q.queued == 0 and all(f.cancelled() for f in b.futures)
    q.requeue(again)
    q.cancel(a)
    assert q.take(10) == [] and q.queued == 0
