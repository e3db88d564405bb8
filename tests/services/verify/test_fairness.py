"""Fair scheduling and cancellation in the verify pool, over HTTP (real uvicorn, real pool).

On the strict instance (conftest.py) every ``STUCK`` item holds a worker for its whole
2 s deadline and is then killed, so one request of such items would hold both workers
for 24 s on a first-come-first-served pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.proto.common import TEAM_HEADER
from arbiter.services.verify.queue import MIN_SHARE
from tests.conftest import start_service
from tests.services.verify.conftest import DEADLINE_S, MARGIN_S, STUCK, metric


def _body(reference: str, responses: list[str]) -> dict[str, Any]:
    return {"groups": [{"reference": reference, "responses": responses}], "params": {}}


async def _settle(url: str) -> None:
    """Wait until no item is queued or running: a stuck item an earlier test left running
    reaches its deadline, and the pool answers a normal item again."""
    await asyncio.sleep(DEADLINE_S + 0.5)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for _ in range(100):
            r = await client.post("/v1/math", json=_body("2", ["\\boxed{\\sqrt{4}}"]))
            if (
                r.json()["groups"][0]["scores"] == [1.0]
                and (await client.get("/readyz")).status_code == 200
            ):
                return
            await asyncio.sleep(0.1)


async def test_second_client_answered_within_one_deadline(strict_url: str) -> None:
    # Client A's request holds the pool with 24 stuck items; client B's normal request,
    # sent half a second later, is answered within one deadline (plus the kill and
    # respawn of A's running items), not after A's 24 deadlines. Then A leaves.
    async with (
        httpx.AsyncClient(base_url=strict_url, timeout=120) as a,
        httpx.AsyncClient(base_url=strict_url, timeout=120) as b,
    ):
        hog = asyncio.create_task(a.post("/v1/math", json=_body("3", [STUCK] * 24)))
        await asyncio.sleep(0.5)
        start = time.monotonic()
        r = await b.post(
            "/v1/math", json=_body("5", [f"\\boxed{{\\sqrt{{{i * i}}}}}" for i in range(8)])
        )
        elapsed = time.monotonic() - start
        assert r.json()["groups"][0]["scores"] == [1.0 if i == 5 else 0.0 for i in range(8)]
        assert elapsed < DEADLINE_S + MARGIN_S, f"{elapsed:.1f}s"
        assert not hog.done()  # A is still being served, its items one deadline each
        hog.cancel()
    await _settle(strict_url)


PLUG_DEADLINE_S = 10.0


@pytest.fixture(scope="module")
def one_worker_url(log_dir: Path) -> Iterator[str]:
    """One worker, chunks of MIN_SHARE items, the fast path off: a queue that is mostly
    waiting (not sent to the worker), where its order decides who runs next. A ``STUCK``
    item holds the worker for PLUG_DEADLINE_S (math-verify's own timeout is above it)."""
    env = {
        "VERIFY_WORKERS": "1",
        "VERIFY_MAX_CHUNK": str(MIN_SHARE),
        "VERIFY_FAST_PATH": "false",
        "VERIFY_DEADLINE_S": str(PLUG_DEADLINE_S),
        "VERIFY_MATH_VERIFY_TIMEOUT_S": "60",
    }
    proc, url = start_service("verify", log_dir, env)
    yield url
    proc.stop()


async def test_another_team_waits_for_the_running_items_not_for_a_flooding_team(
    one_worker_url: str,
) -> None:
    # Team a floods the pool with 300 concurrent requests of MIN_SHARE slow items
    # (math-verify proves an identity, tens of ms each; OpenRLHF and slime post one sample
    # per request, hundreds at once) while a third team's STUCK item holds the only
    # worker: none of a's items has run when team b sends one item. Shared per team, b's
    # request leads the next chunk: it waits for the plug and at most MIN_SHARE of a's
    # items. Shared per request only, b's new request would queue behind every request of
    # a that arrived before it and was never taken (the least charged first, ties by
    # arrival; each chunk taken charges one of a's requests, and a worker that hands its
    # chunks back runs one item or more per DEPTH chunks): some 70 of a's items, 20 with
    # 70 requests. So sending b's request as team a fails this test. Counted in items the
    # pool ran between b's send and b's answer. (The queue's order itself is checked
    # exactly in test_queue.py and test_pool.py; this is the same over HTTP, the team
    # read from the gateway's header.)
    url = one_worker_url
    requests, size = 300, MIN_SHARE
    slow = [f"<answer>\\sin^2(x+{i})+\\cos^2(x+{i})</answer>" for i in range(size)]
    limits = httpx.Limits(max_connections=requests + 10)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        run0 = await asyncio.to_thread(metric, url, "verify_pool_items_run_total")
        plug = asyncio.create_task(
            client.post("/v1/math", json=_body("3", [STUCK]), headers={TEAM_HEADER: "p"})
        )
        await asyncio.sleep(0.5)  # the plug first (if a's flood came first, the check fails)
        flood = [
            asyncio.create_task(
                client.post("/v1/math", json=_body("1", slow), headers={TEAM_HEADER: "a"})
            )
            for _ in range(requests)
        ]
        # until all of a's items wait (up to the DEPTH - 1 chunks sent behind the plug)
        queued = 0.0
        for _ in range(1200):
            queued = await asyncio.to_thread(metric, url, "verify_pool_items_queued")
            if queued >= requests * size - 4 * MIN_SHARE:
                break
            await asyncio.sleep(0.05)
        ran0 = await asyncio.to_thread(metric, url, "verify_pool_items_run_total")
        # the check can discriminate only if none of a's items has run yet
        assert ran0 == run0 and not plug.done(), "a's items ran before b was sent"
        r = await client.post("/v1/math", json=_body("2", ["<answer>2</answer>"]),
                              headers={TEAM_HEADER: "b"})  # fmt: skip
        ran = await asyncio.to_thread(metric, url, "verify_pool_items_run_total") - ran0
        assert r.json()["groups"][0]["scores"] == [1.0]
        for t in [plug, *flood]:
            t.cancel()
    # the plug, then at most one chunk of a's
    assert ran <= 1 + MIN_SHARE, f"b's item waited for {ran:.0f} items ({queued:.0f} queued)"


async def test_a_team_with_history_is_not_starved_by_a_newcomer(one_worker_url: str) -> None:
    # The main training job has used the pool the most (here one STUCK item: PLUG_DEADLINE_S
    # of worker time, more than all of the newcomer's items below) and the pool has
    # drained. A newcomer then queues 15 requests of 8 slow LaTeX answers, and the main
    # job sends one correct response: it joins at the global virtual time the newcomer
    # joined at, so it leads the next chunk and waits for the newcomer's running items,
    # at most one run. Charged by history (each team's worker time, a newcomer starting
    # from 0), it waited for all of the newcomer's 120 items and came back null (timeout).
    url = one_worker_url
    slow = [f"<answer>\\sin^2(x+{i})+\\cos^2(x+{i})</answer>" for i in range(MIN_SHARE)]
    main, newcomer = {TEAM_HEADER: "main"}, {TEAM_HEADER: "newcomer"}
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        history = await client.post("/v1/math", json=_body("3", [STUCK]), headers=main)
        assert history.json()["groups"][0]["scores"] == [None]  # killed at its deadline
        await _settle(url)
        flood = [
            asyncio.create_task(client.post("/v1/math", json=_body("1", slow), headers=newcomer))
            for _ in range(15)
        ]
        for _ in range(600):  # until the newcomer's items wait (4 chunks go to the worker)
            if await asyncio.to_thread(metric, url, "verify_pool_items_queued") >= 15 * 8 - 32:
                break
            await asyncio.sleep(0.02)
        ran0 = await asyncio.to_thread(metric, url, "verify_pool_items_run_total")
        r = await client.post("/v1/math", json=_body("2", ["<answer>2</answer>"]), headers=main)
        ran = await asyncio.to_thread(metric, url, "verify_pool_items_run_total") - ran0
        assert r.json()["groups"][0]["scores"] == [1.0]
        assert sum(t.done() for t in flood) < 15  # the newcomer is still being served
        await asyncio.gather(*flood)
    # its own item and at most one run of the newcomer's
    assert ran <= 1 + MIN_SHARE, f"the main job's item waited for {ran:.0f} items"


async def test_disconnected_client_items_not_run(strict_url: str) -> None:
    # A client sends 30 stuck items and hangs up after a second: the two items running
    # by then finish at their deadline; the other 28 are dropped, never run.
    await _settle(strict_url)
    run0 = metric(strict_url, "verify_pool_items_run_total")
    dropped0 = metric(strict_url, "verify_pool_items_dropped_total")
    cancelled0 = metric(strict_url, "arbiter_http_cancelled_total")
    async with httpx.AsyncClient(base_url=strict_url, timeout=120) as client:
        task = asyncio.create_task(client.post("/v1/math", json=_body("3", [STUCK] * 30)))
        await asyncio.sleep(1.0)
        task.cancel()
    await asyncio.sleep(DEADLINE_S + 1.0)  # the running ones reach their deadline
    ran = metric(strict_url, "verify_pool_items_run_total") - run0
    dropped = metric(strict_url, "verify_pool_items_dropped_total") - dropped0
    assert metric(strict_url, "arbiter_http_cancelled_total") == cancelled0 + 1
    assert ran <= 2, ran  # one per worker: the items running when the client left
    assert dropped >= 28, dropped
    await _settle(strict_url)


@pytest.fixture(scope="module")
def gateway_strict(log_dir: Path, strict_url: str, redis_url: str) -> Iterator[str]:
    """A gateway in front of the strict verify instance."""
    proc, url = start_service(
        "gateway", log_dir, {"GATEWAY_VERIFY_URL": strict_url, "REDIS_URL": redis_url}
    )
    yield url
    proc.stop()


async def test_client_leaving_the_gateway_cancels_down_to_the_workers(
    gateway_strict: str, strict_url: str
) -> None:
    # gateway -> verify -> worker: the client of the gateway hangs up; the gateway cancels
    # its call to verify (closing that connection), verify cancels the request, and the
    # pool drops its queued items. 30 distinct stuck items (the gateway scores identical
    # responses once); two are running when the client leaves.
    await _settle(strict_url)
    run0 = metric(strict_url, "verify_pool_items_run_total")
    dropped0 = metric(strict_url, "verify_pool_items_dropped_total")
    recipe = {"components": [{"name": "math_accuracy", "weight": 1.0, "params": {}}]}
    stuck = [f"\\boxed{{7^{{{123456789 + k}}}}}" for k in range(30)]
    body = {"recipe": recipe, "groups": [{"reference": "3", "responses": stuck}]}
    async with httpx.AsyncClient(base_url=gateway_strict, timeout=120) as client:
        task = asyncio.create_task(client.post("/v1/score", json=body))
        await asyncio.sleep(1.0)
        task.cancel()
    await asyncio.sleep(DEADLINE_S + 1.0)
    assert metric(gateway_strict, "arbiter_http_cancelled_total", service="gateway") == 1
    ran = metric(strict_url, "verify_pool_items_run_total") - run0
    dropped = metric(strict_url, "verify_pool_items_dropped_total") - dropped0
    assert ran <= 2, ran
    assert dropped >= 28, dropped
    await _settle(strict_url)
