"""Results land on exactly the right group and index, under concurrency and cache hits."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_service
from tests.services.gateway.conftest import gsm8k_groups, score


@pytest.fixture(scope="module")
def cached_gateway(log_dir: Path, verify_url: str, redis_url: str) -> Iterator[str]:
    # Tiny chunks, so one request becomes several component calls per component.
    env = {
        "GATEWAY_VERIFY_URL": verify_url,
        "REDIS_URL": redis_url,
        "GATEWAY_BATCH_GROUPS": "3",
        "GATEWAY_BATCH_RESPONSES": "10",
    }
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def uncached_gateway(log_dir: Path, verify_url: str) -> Iterator[str]:
    env = {"GATEWAY_VERIFY_URL": verify_url, "GATEWAY_CACHE_ENABLED": "false"}
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()


def shuffled(groups: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for g in groups:
        responses = list(g["responses"])
        rng.shuffle(responses)
        out.append({**g, "responses": responses})
    return out


async def test_order_under_concurrency_and_partial_hits(
    cached_gateway: str, uncached_gateway: str, gsm8k_dir: Path
) -> None:
    rng = random.Random(7)
    groups = shuffled(gsm8k_groups(gsm8k_dir, 30, offset=300), rng)
    by_id = {g["id"]: g for g in groups}

    # What each group scores alone, with no cache anywhere.
    expected = {}
    for g in groups:
        r = await score(uncached_gateway, {"recipe": "gsm8k", "groups": [g]})
        assert r.status_code == 200, r.text
        expected[g["id"]] = r.json()["groups"][0]

    # Prime the cache with parts of the first 20 groups: the first three responses only,
    # so later requests mix hits and misses inside one group.
    primes = [{**g, "responses": g["responses"][:3]} for g in groups[:20]]
    r = await score(cached_gateway, {"recipe": "gsm8k", "groups": primes})
    assert r.status_code == 200, r.text

    # 20 concurrent requests of 1-6 groups each, in random order, repeats allowed.
    picks = [[rng.choice(groups)["id"] for _ in range(rng.randint(1, 6))] for _ in range(20)]
    bodies = [{"recipe": "gsm8k", "groups": [by_id[i] for i in ids]} for ids in picks]
    results = await asyncio.gather(*(score(cached_gateway, b) for b in bodies))

    hits = 0
    for ids, r in zip(picks, results, strict=True):
        assert r.status_code == 200, r.text
        body = r.json()
        assert [g["id"] for g in body["groups"]] == ids
        for got in body["groups"]:
            want = expected[got["id"]]
            for key in ("rewards", "components", "masked", "errors"):
                assert got[key] == want[key], (got["id"], key)
        hits += body["usage"]["cache_hits"]
    assert hits > 0  # the primed prefixes were served from Redis


async def test_many_groups_are_chunked_and_kept_in_order(
    cached_gateway: str, uncached_gateway: str, gsm8k_dir: Path
) -> None:
    groups = gsm8k_groups(gsm8k_dir, 25, offset=400)  # 25 groups: 9+ calls per component
    alone = (await score(uncached_gateway, {"recipe": "gsm8k", "groups": groups})).json()
    chunked = (await score(cached_gateway, {"recipe": "gsm8k", "groups": groups})).json()
    assert [g["id"] for g in chunked["groups"]] == [g["id"] for g in groups]
    for a, b in zip(alone["groups"], chunked["groups"], strict=True):
        assert a["components"] == b["components"] and a["rewards"] == b["rewards"]
