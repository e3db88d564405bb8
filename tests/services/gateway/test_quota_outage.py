"""Quotas and the ledger while Redis stalls under a flood: a team is answered at most its
quota (+10 %), another team is still served, and the ledger counts every answered and
every refused request once Redis is back.

Real processes: a gateway with keys on the session's verify service, a Redis of its own
stopped (SIGSTOP: connections stay open, every call times out) for 8 s in the middle of a
flood of 400 concurrent one-response requests, with the gateway's pool cut to 8 connections.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import start_redis
from tests.services.gateway.teams import Keys, groups, start_gateway, team_total, usage

RPM = 120
CONCURRENCY = 400
FLOOD_S = 20.0
STALL_AT_S, STALL_S = 4.0, 8.0


# Another team's client: one two-response request every 0.5 s; prints [[status, seconds]].
OTHER_TEAM = """
import json, sys, time, uuid
import httpx
url, authorization, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
out, end = [], time.monotonic() + seconds
with httpx.Client(base_url=url, timeout=120, headers={"Authorization": authorization}) as c:
    while time.monotonic() < end:
        tag = uuid.uuid4().hex
        group = {"prompt": tag + ": 1 + 1?", "reference": "2",
                 "responses": [f"<think>{tag}</think><answer>2</answer>", "3"]}
        sent = time.monotonic()
        r = c.post("/v1/score", json={"recipe": "gsm8k", "groups": [group]})
        out.append([r.status_code, time.monotonic() - sent])
        time.sleep(0.5)
print(json.dumps(out))
"""


@dataclass
class Flood:
    """What the clients saw."""

    url: str
    keys: Keys
    started: float = 0.0
    ended: float = 0.0
    stalled: tuple[float, float] = (0.0, 0.0)
    statuses: Counter[int] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    answered_at: list[float] = field(default_factory=list)  # when each 200 was sent
    other: list[int] = field(default_factory=list)  # the other team's statuses
    other_s: list[float] = field(default_factory=list)  # and how long each took

    @property
    def allowed(self) -> float:
        """The quota over the flood: a full bucket, then RPM a minute."""
        return RPM + RPM * (self.ended - self.started) / 60


async def _flood(flood: Flood, pause: asyncio.Event) -> None:
    h_flood, h_other = flood.keys.headers("flood"), flood.keys.headers("other")
    # A connection per request: a client this busy may read an answer seconds late and
    # reuse its connection just as the server closes it after its 5 s keep-alive.
    limits = httpx.Limits(max_connections=CONCURRENCY + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=flood.url, timeout=120, limits=limits) as client:
        stop_at = time.monotonic() + FLOOD_S

        async def one_client(i: int) -> None:
            while time.monotonic() < stop_at:
                sent = time.monotonic()
                body = {"recipe": "gsm8k", "groups": groups(1, 1, tag=f"c{i}-{sent}")}
                r = await client.post("/v1/score", json=body, headers=h_flood)
                flood.statuses[r.status_code] += 1
                if r.status_code == 200:
                    flood.answered_at.append(sent)
                else:
                    flood.codes[r.json()["error"]["code"]] += 1
                    # a client that waits what Retry-After asks, a second at most
                    await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), 1.0))

        async def other_team() -> None:
            # its own process: its latency is the gateway's, not this flooding client's
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", OTHER_TEAM, flood.url, h_other["Authorization"],
                str(FLOOD_S), stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate()
            for status, seconds in json.loads(out):
                flood.other.append(status)
                flood.other_s.append(seconds)

        flood.started = time.monotonic()
        tasks = [asyncio.create_task(one_client(i)) for i in range(CONCURRENCY)]
        tasks.append(asyncio.create_task(other_team()))
        await asyncio.sleep(STALL_AT_S)
        pause.set()
        await asyncio.gather(*tasks)
        flood.ended = time.monotonic()


@pytest.fixture(scope="module")
def flood(
    log_dir: Path, verify_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Flood]:
    keys = Keys(tmp_path_factory.mktemp("outage") / "keys.yaml")
    keys.add("flood", "flood", responses_per_minute=RPM)
    keys.add("other", "other", responses_per_minute=6000)
    keys.add("ops", "ops", admin=True)
    redis, redis_url = start_redis(log_dir)
    gateway, url = start_gateway(
        log_dir, verify_url, redis_url, keys, GATEWAY_REDIS_MAX_CONNECTIONS="8"
    )
    assert redis.proc is not None
    pid = redis.proc.pid
    result = Flood(url, keys)
    try:

        async def run() -> None:
            pause = asyncio.Event()
            flooding = asyncio.create_task(_flood(result, pause))
            await pause.wait()
            os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                await asyncio.sleep(STALL_S)
            finally:
                os.kill(pid, signal.SIGCONT)
            result.stalled = (stopped, time.monotonic())
            await flooding

        asyncio.run(run())
        yield result
    finally:
        os.kill(pid, signal.SIGCONT)
        gateway.stop()
        redis.stop()


def test_a_flooding_team_is_answered_at_most_its_quota_while_redis_stalls(flood: Flood) -> None:
    answered = flood.statuses[200]
    print(f"answered {answered} of {flood.allowed:.0f} allowed; {flood.statuses} {flood.codes}")
    print(f"other team: {len(flood.other)} requests, {max(flood.other_s):.2f} s at most")
    assert answered <= 1.1 * flood.allowed, (answered, flood.allowed, flood.statuses)
    # Training goes on: the flood's team is served to its quota, during the stall as well.
    assert answered >= 0.5 * flood.allowed, (answered, flood.allowed, flood.statuses)
    start, end = flood.stalled
    assert any(start + 1 <= t <= end for t in flood.answered_at), flood.answered_at
    # Every refusal is a retryable 429 of the team's quota (never a 5xx).
    assert set(flood.statuses) <= {200, 429}, flood.statuses
    assert set(flood.codes) <= {"quota_exceeded", "quota_busy"}, flood.codes


def test_another_team_is_served_through_the_flood_and_the_stall(flood: Flood) -> None:
    assert len(flood.other) >= 5, (flood.other, flood.other_s, flood.statuses, flood.codes)
    assert set(flood.other) == {200}, Counter(flood.other)


def test_the_ledger_has_every_answered_and_refused_request_after_the_stall(
    flood: Flood,
) -> None:
    report = usage(flood.url, flood.keys.headers("ops"), team="flood")
    assert team_total(report, "flood", "requests") == flood.statuses[200]
    assert team_total(report, "flood", "responses") == flood.statuses[200]
    assert team_total(report, "flood", "rate_limited") == flood.statuses[429]
    other = usage(flood.url, flood.keys.headers("ops"), team="other")
    assert team_total(other, "other", "requests") == len(flood.other)
    # The stall reached the ledger (its writes failed and were retried), and nothing waits.
    metrics = gateway_metrics(flood.url, flood.keys.headers("ops"))
    assert metrics.get(("arbiter_gateway_redis_errors_total", "usage"), 0) > 0, metrics
    assert metrics[("arbiter_gateway_usage_pending", "")] == 0
    assert metrics.get(("arbiter_gateway_usage_dropped_total", ""), 0) == 0


def gateway_metrics(url: str, headers: dict[str, str]) -> dict[tuple[str, str], float]:
    """(sample name, its ``op`` label or "") -> value, from the gateway's /metrics."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    return {
        (s.name, s.labels.get("op", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
