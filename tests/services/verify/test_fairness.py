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


@pytest.fixture(scope="module")
def one_worker_url(log_dir: Path) -> Iterator[str]:
    """One worker, chunks of MIN_SHARE items, the fast path off: a queue that is mostly
    waiting (not sent to the worker), where its order decides who runs next."""
    env = {"VERIFY_WORKERS": "1", "VERIFY_MAX_CHUNK": str(MIN_SHARE), "VERIFY_FAST_PATH": "false"}
    proc, url = start_service("verify", log_dir, env)
    yield url
    proc.stop()


async def test_another_team_waits_for_the_running_items_not_for_a_flooding_team(
    one_worker_url: str,
) -> None:
    # Team a sends 70 concurrent requests of 6 slow items (math-verify proves an identity,
    # tens of ms each): one sample per POST, as OpenRLHF and slime send. Team b's 1-item
    # request, sent while they run, waits for the chunk running then to be handed back,
    # not for a's queued items: counted in items the pool ran between b's send and b's
    # answer. (The queue's order itself is checked exactly in test_queue.py and
    # test_pool.py; this is the same over HTTP, the team read from the gateway's header.)
    url = one_worker_url
    slow = [f"<answer>\\sin^2(x+{i})+\\cos^2(x+{i})</answer>" for i in range(6)]
    limits = httpx.Limits(max_connections=80)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        flood = [
            asyncio.create_task(
                client.post("/v1/math", json=_body("1", slow), headers={TEAM_HEADER: "a"})
            )
            for _ in range(70)
        ]
        for _ in range(600):  # until a's items are running
            if metric(url, "verify_pool_items_run_total") >= 4:
                break
            await asyncio.sleep(0.05)
        ran0 = metric(url, "verify_pool_items_run_total")
        r = await client.post("/v1/math", json=_body("2", ["<answer>2</answer>"]),
                              headers={TEAM_HEADER: "b"})  # fmt: skip
        ran = metric(url, "verify_pool_items_run_total") - ran0
        assert r.json()["groups"][0]["scores"] == [1.0]
        for t in flood:
            t.cancel()
    assert ran <= MIN_SHARE, f"b's item waited for {ran} of a's items"


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
