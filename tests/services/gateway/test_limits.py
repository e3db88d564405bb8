"""A big valid request is scored right and does not hold the gateway's event loop: its
CPU-bound steps run on a worker thread (``THREAD_RESPONSES``) and its cache round trips
go in chunks (``CHUNK_KEYS``). Real gateway, verify and Redis."""

from __future__ import annotations

import asyncio
import time

import httpx

from arbiter.services.gateway.scoring import THREAD_RESPONSES


async def _healthz_while(url: str, work: asyncio.Task[httpx.Response]) -> list[float]:
    waits = []
    async with httpx.AsyncClient(timeout=30) as client:
        while not work.done():
            start = time.perf_counter()
            await client.get(f"{url}/healthz")
            waits.append(time.perf_counter() - start)
            await asyncio.sleep(0.02)
    return waits


async def _run(url: str, body: dict[str, object]) -> tuple[httpx.Response, list[float]]:
    async with httpx.AsyncClient(timeout=120) as client:
        work = asyncio.create_task(client.post(f"{url}/v1/score", json=body))
        waits = await _healthz_while(url, work)
        return await work, waits


def test_a_big_request_is_scored_while_others_are_served(gateway_url: str) -> None:
    per = 256
    n_groups = THREAD_RESPONSES // per + 2  # past the threshold: the threaded path
    groups = [
        {"id": f"g{i}", "reference": str(i),
         "responses": [f"<think>t</think><answer>{i + j % 2}</answer>-{j}" for j in range(per)]}
        for i in range(n_groups)
    ]  # fmt: skip
    resp, waits = asyncio.run(_run(gateway_url, {"recipe": "gsm8k", "groups": groups}))
    assert resp.status_code == 200, resp.text[:300]
    out = resp.json()["groups"]
    for i, group in enumerate(out):
        assert group["id"] == f"g{i}"
        # even j answers i (math 1.0), odd j answers i + 1 (math 0.0); format 1.0 for both
        assert group["components"]["math_accuracy"][:4] == [1.0, 0.0, 1.0, 0.0]
        assert group["masked"] == [False] * per
    assert waits, "the big request finished before /healthz was asked"
    # The loop stays free: a health check is never held for the whole request (on a
    # shared 2-core machine the CPU itself is contended, hence the generous bound).
    assert max(waits) < 2.0, f"healthz waited {max(waits):.2f} s"
