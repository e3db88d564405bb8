"""Failure semantics with real processes: a component down, hung or answering garbage,
and Redis going away and coming back. A failed component gives null + mask + an error
entry for its scores only; the other components' scores are unaffected."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from arbiter.procs import free_port, redis_process, wait_port
from tests.conftest import start_redis, start_service
from tests.services.gateway.conftest import (
    EXPECTED_FORMAT,
    EXPECTED_MATH,
    RawServer,
    gsm8k_groups,
    score,
)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of a prometheus sample's values whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url)


def assert_masked(group: dict[str, Any], component: str, kind: str) -> None:
    n = len(group["rewards"])
    assert group["components"][component] == [None] * n
    assert group["rewards"] == [None] * n and group["masked"] == [True] * n
    errs = [e for e in group["errors"] if e["component"] == component]
    assert [e["index"] for e in errs] == list(range(n))
    assert {e["kind"] for e in errs} == {kind}, errs


async def test_stopped_verify_masks_only_its_component(log_dir: Path, gsm8k_dir: Path) -> None:
    # math_accuracy on one verify instance, format on another (GATEWAY_COMPONENT_URLS), so
    # stopping the first breaks exactly one component. No cache: every call is live.
    math_proc, math_url = start_service("verify", log_dir, {"VERIFY_WORKERS": "1"})
    fmt_proc, fmt_url = start_service("verify", log_dir, {"VERIFY_WORKERS": "1"})
    env = {
        "GATEWAY_VERIFY_URL": math_url,
        "GATEWAY_COMPONENT_URLS": json.dumps({"format": fmt_url}),
        "GATEWAY_CACHE_ENABLED": "false",
    }
    gw_proc, gw = start_service("gateway", log_dir, env)
    try:
        groups = gsm8k_groups(gsm8k_dir, 2, offset=500)
        before = (await score(gw, {"recipe": "gsm8k", "groups": groups})).json()
        assert before["groups"][0]["components"]["math_accuracy"] == EXPECTED_MATH

        math_proc.stop()  # the math_accuracy service goes away mid-test
        r = await score(gw, {"recipe": "gsm8k", "groups": groups})
        assert r.status_code == 200, r.text
        for group in r.json()["groups"]:
            assert_masked(group, "math_accuracy", "unavailable")
            assert group["components"]["format"] == EXPECTED_FORMAT  # unaffected

        fail = await score(gw, {"recipe": "gsm8k", "groups": groups, "on_error": "fail"})
        assert fail.status_code == 503
        assert fail.json()["error"]["type"] == "unavailable"
        assert "math_accuracy" in fail.json()["error"]["message"]

        ready = await get(f"{gw}/readyz")
        # Still in service (format is fine), but it says which component is down.
        assert ready.status_code == 200
        assert ready.json()["checks"]["verify"].startswith("degraded: ")
        metrics = (await get(f"{gw}/metrics")).text
        errors = "arbiter_gateway_component_errors_total"
        assert metric(metrics, errors, component="math_accuracy", kind="unavailable") >= 12
    finally:
        gw_proc.stop()
        fmt_proc.stop()
        math_proc.stop()


async def test_dead_hung_and_garbage_components(
    log_dir: Path,
    verify_url: str,
    gsm8k_dir: Path,
    hung_server: RawServer,
    garbage_server: RawServer,
) -> None:
    env = {
        "GATEWAY_VERIFY_URL": verify_url,
        "GATEWAY_JUDGE_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "GATEWAY_EMBEDDING_URL": hung_server.url,  # accepts, never answers
        "GATEWAY_COMPONENT_URLS": json.dumps({"judge_verifier": garbage_server.url}),
        "GATEWAY_COMPONENT_TIMEOUTS": json.dumps({"diversity": 1.0}),
    }
    gw_proc, gw = start_service("gateway", log_dir, env)
    try:
        groups = gsm8k_groups(gsm8k_dir, 2, offset=520)
        cases = [
            ("gsm8k-dj", "judge_quality", "unavailable"),  # connection refused
            ("gsm8k-diverse", "diversity", "timeout"),  # no answer within 1 s
            ("gsm8k-verifier", "judge_verifier", "bad_response"),  # not the contract
        ]
        for recipe, broken, kind in cases:
            start = time.monotonic()
            r = await score(gw, {"recipe": recipe, "groups": groups})
            assert time.monotonic() - start < 1.0 + 5.0  # deadline + margin
            assert r.status_code == 200, r.text
            for group in r.json()["groups"]:
                assert_masked(group, broken, kind)
                assert group["components"]["format"] == EXPECTED_FORMAT
                if "math_accuracy" in group["components"]:
                    assert group["components"]["math_accuracy"] == EXPECTED_MATH

        # on_error=fail: the whole request fails, retryable, with the right status.
        for recipe, status, type_ in [
            ("gsm8k-diverse", 504, "timeout"),
            ("gsm8k-dj", 503, "unavailable"),
        ]:
            r = await score(gw, {"recipe": recipe, "groups": groups, "on_error": "fail"})
            assert r.status_code == status, r.text
            assert r.json()["error"]["type"] == type_

        ready = (await get(f"{gw}/readyz")).json()
        assert ready["ready"] is True and ready["checks"]["verify"] == "ok"
        assert ready["checks"]["judge"].startswith("degraded: ")  # refused
        assert ready["checks"]["embedding"].startswith("degraded: ")  # hung
    finally:
        gw_proc.stop()


async def test_redis_stopped_then_back(log_dir: Path, verify_url: str, gsm8k_dir: Path) -> None:
    redis_proc, redis_url = start_redis(log_dir)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    env = {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url, "GATEWAY_REDIS_RETRY_S": "0.2"}
    gw_proc, gw = start_service("gateway", log_dir, env)
    try:
        groups = gsm8k_groups(gsm8k_dir, 2, offset=540)
        body = {"recipe": "gsm8k", "groups": groups}
        first = (await score(gw, body)).json()
        assert (await score(gw, body)).json()["usage"]["cache_hits"] == 24

        redis_proc.stop()  # Redis goes away mid-test
        start = time.monotonic()
        r = await score(gw, body)
        assert time.monotonic() - start < 5.0
        assert r.status_code == 200, r.text
        down = r.json()
        assert down["usage"]["cache_hits"] == 0
        for a, b in zip(first["groups"], down["groups"], strict=True):
            assert a["components"] == b["components"] and a["rewards"] == b["rewards"]
        metrics = (await get(f"{gw}/metrics")).text
        assert metric(metrics, "arbiter_gateway_redis_errors_total") >= 1
        ready = await get(f"{gw}/readyz")
        assert ready.status_code == 200  # still serving, without its cache
        assert ready.json()["checks"]["cache"].startswith("degraded")

        # Redis comes back on the same port: the gateway caches again without a restart.
        redis_proc = redis_process(port, log_path=log_dir / f"redis-{port}-again.log").start()
        wait_port(port)
        fresh = {"recipe": "gsm8k", "groups": gsm8k_groups(gsm8k_dir, 1, offset=560)}
        deadline = time.monotonic() + 10
        hits = 0
        while time.monotonic() < deadline and hits == 0:
            await score(gw, fresh)
            hits = (await score(gw, fresh)).json()["usage"]["cache_hits"]
            await asyncio.sleep(0.1)
        assert hits == 12
    finally:
        gw_proc.stop()
        redis_proc.stop()
