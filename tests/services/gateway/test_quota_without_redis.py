"""The quota when Redis cannot answer, on real Redis servers (absent, started late, busy):
each process enforces its share alone, owes Redis what it took, a team whose quota calls
queue for Redis is refused with 429 quota_busy while another team passes, and a burst past
the quota is refused without asking Redis.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from arbiter.errors import RateLimited
from arbiter.keys import Principal, Team
from arbiter.procs import ManagedProcess, free_port, redis_process
from arbiter.services.gateway.quota import Quota

RPM = 60


def team(name: str, rpm: int = RPM) -> Principal:
    return Principal(name, None, False, Team(responses_per_minute=rpm))


def quota_errors() -> float:
    return REGISTRY.get_sample_value("arbiter_gateway_redis_errors_total", {"op": "quota"}) or 0


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
async def client(port: int) -> AsyncIterator[Redis]:
    """A client of a Redis on ``port``, which nothing serves until a test starts one."""
    redis = Redis.from_url(
        f"redis://127.0.0.1:{port}/0", socket_timeout=3, socket_connect_timeout=0.3
    )
    yield redis
    await redis.aclose()


@pytest.fixture
def late_redis(port: int, log_dir: Path) -> Iterator[ManagedProcess]:
    proc = redis_process(port, log_path=log_dir / f"redis-{port}.log")
    yield proc
    proc.stop()


async def take_all(quota: Quota, who: Principal, n: int) -> tuple[int, list[RateLimited]]:
    """Take one response ``n`` times in a row: (taken, the refusals)."""
    taken, refused = 0, []
    for _ in range(n):
        try:
            taken += await quota.take(who, 1, uses_judge=False)
        except RateLimited as exc:
            refused.append(exc)
    return taken, refused


# (the process's share of the quota, what it lets through of 70 one-response requests)
SHARES = [
    (1.0, RPM),  # one process: the whole bucket
    (0.5, RPM // 2),  # two replicas: half each
]


@pytest.mark.parametrize(("share", "passes"), SHARES)
async def test_without_redis_a_process_serves_its_share_and_no_more(
    client: Redis, share: float, passes: int
) -> None:
    errors = quota_errors()
    quota = Quota(client, share=share, retry_s=0.05)
    taken, refused = await take_all(quota, team(f"alone-{share}"), 70)
    assert passes <= taken <= passes + 1  # 70 in well under a second: one more refilled
    assert len(refused) == 70 - taken
    assert {r.code for r in refused} == {"quota_exceeded"}
    wait = refused[-1].retry_after
    assert wait is not None and 0 < wait <= 1 / share + 0.1  # one response's refill
    assert quota_errors() > errors  # every fallback is counted


async def test_what_a_process_took_without_redis_is_owed_to_it(
    client: Redis, late_redis: ManagedProcess, port: int
) -> None:
    quota = Quota(client, retry_s=0.05)
    who = team("owing")
    assert (await take_all(quota, who, 40))[0] == 40  # Redis down: taken in process
    late_redis.start().wait_ready(10)
    await asyncio.sleep(0.1)  # past GATEWAY_REDIS_RETRY_S: the next call tries Redis
    # The shared bucket gets the 40 first: 20 are left, not 60.
    with pytest.raises(RateLimited) as refused:
        await quota.take(who, 30, uses_judge=False)
    assert refused.value.retry_after is not None and 9 <= refused.value.retry_after <= 11
    # Another replica, whose own buckets are full, reads the same shared bucket.
    other = Redis.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        with pytest.raises(RateLimited):
            await Quota(other).take(who, 30, uses_judge=False)
        assert await Quota(other).take(who, 20, uses_judge=False) == 20
    finally:
        await other.aclose()


# A script that keeps Redis busy for ``ARGV[1]`` ms: every other client waits (slow, not down).
BUSY_LUA = """
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
while true do
  t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) - start > tonumber(ARGV[1]) * 1000 then break end
end
return 1
"""


async def test_a_team_queued_for_redis_gets_quota_busy_and_another_team_passes(
    client: Redis, late_redis: ManagedProcess, port: int
) -> None:
    late_redis.start().wait_ready(10)
    errors = quota_errors()
    quota = Quota(client, per_team=2, wait_s=0.3)
    blocker = Redis.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        busy = asyncio.ensure_future(blocker.eval(BUSY_LUA, 0, "1000"))
        await asyncio.sleep(0.05)  # Redis is in the script now
        start = time.monotonic()
        flood = [quota.take(team("flooder", 6000), 1, uses_judge=False) for _ in range(20)]
        results = await asyncio.gather(
            *flood, quota.take(team("calm", 6000), 1, uses_judge=False), return_exceptions=True
        )
        await busy
    finally:
        await blocker.aclose()
    *flooded, calm = results
    assert calm == 1, calm  # its own turn: it waited for Redis, not for the flood
    busy_429 = [r for r in flooded if isinstance(r, RateLimited)]
    assert len(busy_429) == 18, flooded  # two at Redis, the rest past their 0.3 s wait
    assert {(r.code, r.retry_after) for r in busy_429} == {("quota_busy", 1.0)}
    assert [r for r in flooded if not isinstance(r, RateLimited)] == [1, 1]
    assert time.monotonic() - start < 3
    assert quota_errors() == errors  # a queue is not an outage: Redis was asked, and answered


async def script_calls(redis: Redis) -> int:
    """Script runs Redis has served (``INFO commandstats``)."""
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


async def test_a_burst_past_the_quota_is_refused_without_asking_redis(
    client: Redis, late_redis: ManagedProcess
) -> None:
    late_redis.start().wait_ready(10)
    quota = Quota(client, per_team=2, wait_s=5)
    before = await script_calls(client)
    burst = [quota.take(team("burst"), 1, uses_judge=False) for _ in range(100)]
    results = await asyncio.gather(*burst, return_exceptions=True)
    refused = [r for r in results if isinstance(r, RateLimited)]
    assert sum(r for r in results if isinstance(r, int)) == RPM
    assert len(refused) == 100 - RPM
    assert {r.code for r in refused} == {"quota_exceeded"}  # not one waited into quota_busy
    # The 40 past the quota were refused by what this process had taken or had waiting.
    assert await script_calls(client) - before <= RPM + 2
