"""A big valid request is scored right and does not hold the gateway's event loop: its
CPU-bound steps run on a worker thread (``THREAD_RESPONSES``) and its cache round trips
go in chunks (``CHUNK_KEYS``). Rewards are finite or null. Real gateway, verify and Redis;
a stand-in component only for a score no real one answers."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from arbiter.services.scoring.scoring import THREAD_RESPONSES
from tests.conftest import start_service
from tests.services.gateway.conftest import RawServer, http_reply


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


def test_a_sum_that_overflows_is_null_not_infinity(log_dir: Path, verify_url: str) -> None:
    # Weights are bounded, but a component may answer a huge finite score: 1e308 x 1e6
    # overflows. A stand-in format service answers 1e308 (no real one can be made to).
    group = {"id": "", "scores": [1e308], "errors": []}
    reply = json.dumps({"component": "format", "usage": {}, "groups": [group]}).encode()
    server = RawServer(http_reply("200 OK", reply))
    proc, url = start_service("gateway", log_dir, {
        "GATEWAY_VERIFY_URL": verify_url,
        "GATEWAY_COMPONENT_URLS": json.dumps({"format": server.url}),
        "GATEWAY_CACHE_ENABLED": "false",
    })  # fmt: skip
    try:
        recipe = {"components": [{"name": "format", "weight": 1e6},
                                 {"name": "math_accuracy", "weight": 1.0}]}  # fmt: skip
        body = {"recipe": recipe, "groups": [{"reference": "4", "responses": ["\\boxed{4}"]}]}
        r = httpx.post(f"{url}/v1/score", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert "Infinity" not in r.text  # strict JSON
        group = r.json()["groups"][0]
        assert group["rewards"] == [None] and group["masked"] == [True]
        assert group["components"]["math_accuracy"] == [1.0]
        assert [(e["component"], e["index"], e["kind"]) for e in group["errors"]] == [
            ("reward", 0, "bad_response")
        ]
    finally:
        proc.stop()
        server.close()
