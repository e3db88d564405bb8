"""The teams' state apart from the cache: ledgers, quotas and idempotency keys live in the
state Redis (``GATEWAY_STATE_REDIS_URL``, ``noeviction``), so filling the LRU cache Redis
to its maxmemory evicts none of them; a team's stored idempotency answers are bounded by
``GATEWAY_IDEMPOTENCY_TEAM_BYTES`` (its oldest dropped), without touching another team's.

Real redis-server processes (``arbiter.procs``, as ``arbiter up`` starts them) and a real
gateway process."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis
from pydantic import ValidationError
from redis.asyncio import Redis

from arbiter.procs import ManagedProcess, free_port, redis_process, state_redis_process
from arbiter.services.gateway.idempotency import Claim, Idempotency, Replay, budget_keys
from arbiter.services.gateway.settings import GatewaySettings
from tests.services.gateway.teams import Keys, groups, post, start_gateway, team_total, usage


def _start(proc: ManagedProcess) -> str:
    proc.start().wait_ready(10)
    return f"redis://127.0.0.1:{proc.port}/0"


@pytest.fixture
def state_redis(log_dir: Path, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = state_redis_process(port, log_dir / f"state-redis-{port}.log", tmp_path / "state")
    yield _start(proc)
    proc.stop()


@pytest.fixture
def small_cache(log_dir: Path) -> Iterator[str]:
    """The cache Redis as `arbiter up` runs it (allkeys-lru), bounded at 2 MB to fill fast."""
    port = free_port()
    proc = redis_process(port, log_dir / f"cache-redis-{port}.log", maxmemory="2mb")
    yield _start(proc)
    proc.stop()


def test_state_redis_never_evicts(state_redis: str) -> None:
    config = redis.Redis.from_url(state_redis).config_get("maxmemory-policy")
    assert config["maxmemory-policy"] == "noeviction"


def test_a_full_cache_evicts_no_ledger_quota_or_idempotency_key(
    log_dir: Path, verify_url: str, small_cache: str, state_redis: str, tmp_path: Path
) -> None:
    keys = Keys(tmp_path / "keys.yaml")
    keys.add("a", "a", responses_per_minute=1000)
    env = {"GATEWAY_STATE_REDIS_URL": state_redis}
    proc, gateway = start_gateway(log_dir, verify_url, small_cache, keys, **env)
    cache, state = redis.Redis.from_url(small_cache), redis.Redis.from_url(state_redis)
    try:
        body = {"recipe": "gsm8k", "groups": groups(2, 2)}
        idem = keys.headers("a", **{"Idempotency-Key": uuid.uuid4().hex})
        first = post(gateway, body, idem)
        assert first.status_code == 200, first.text
        assert team_total(usage(gateway, keys.headers("a")), "a", "responses") == 4
        held = {k: state.type(k) for k in state.scan_iter("arb:*")}
        kinds = {k.decode().split(":")[1] for k in held}
        assert {"usage", "quota", "idem", "idem-order", "idem-bytes"} <= kinds, held
        assert not any(k.startswith(b"arb:usage") for k in cache.scan_iter("arb:*"))

        # Fill the cache Redis past its maxmemory with cache-shaped entries.
        filler = b"x" * 4096
        for i in range(2000):
            cache.set(f"arb:v1:team:a:filler:{i}", filler)
        assert int(cache.info("stats")["evicted_keys"]) > 0

        assert {k: state.type(k) for k in state.scan_iter("arb:*")} == held
        again = post(gateway, body, idem)
        assert again.status_code == 200 and again.headers.get("Idempotent-Replayed") == "true"
        assert again.content == first.content
        assert team_total(usage(gateway, keys.headers("a")), "a", "responses") == 4
    finally:
        proc.stop()


def test_the_gateway_applies_its_team_budget(
    log_dir: Path, verify_url: str, redis_url: str, state_redis: str, tmp_path: Path
) -> None:
    """GATEWAY_IDEMPOTENCY_TEAM_BYTES reaches the gateway: an answer over a 1 KiB budget is
    not stored, so its retry is scored (and counted) again instead of replayed."""
    keys = Keys(tmp_path / "keys.yaml")
    keys.add("a", "a")
    env = {"GATEWAY_STATE_REDIS_URL": state_redis, "GATEWAY_IDEMPOTENCY_TEAM_BYTES": "1024"}
    proc, gateway = start_gateway(log_dir, verify_url, redis_url, keys, **env)
    try:
        body = {"recipe": "gsm8k", "groups": groups(4, 2)}
        idem = keys.headers("a", **{"Idempotency-Key": uuid.uuid4().hex})
        first = post(gateway, body, idem)
        assert first.status_code == 200 and len(first.content) > 1024, first.text
        again = post(gateway, body, idem)
        assert again.status_code == 200 and "Idempotent-Replayed" not in again.headers
        assert team_total(usage(gateway, keys.headers("a")), "a", "requests") == 2
    finally:
        proc.stop()


@pytest_asyncio.fixture
async def state(state_redis: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(state_redis)
    yield client
    await client.aclose()


async def _store(idem: Idempotency, team: str, key: str, body: bytes) -> None:
    claim = await idem.begin(team, key, "POST", "/v1/score", key.encode())
    assert isinstance(claim, Claim), claim
    await idem.finish(claim, body)


async def _replayed(idem: Idempotency, team: str, key: str) -> bytes | None:
    """The stored answer of ``key``, or None (the key was free: it is claimed, then let go)."""
    found = await idem.begin(team, key, "POST", "/v1/score", key.encode())
    if isinstance(found, Claim):
        await idem.release(found)
        return None
    assert isinstance(found, Replay), found
    return found.body


@pytest.mark.asyncio
async def test_a_team_past_its_budget_loses_its_oldest_answers_only(state: Redis) -> None:
    idem = Idempotency(state, ttl_s=3600, wait_s=0, team_bytes=10_000)
    answer = b"y" * 3000  # stored with a 65-byte head: three fit in 10,000, four do not
    for i in range(3):
        await _store(idem, "quiet", f"q{i}", answer)
    for i in range(5):
        await _store(idem, "filler", f"f{i}", answer)

    filler = [await _replayed(idem, "filler", f"f{i}") for i in range(5)]
    assert filler == [None, None, answer, answer, answer]  # the two oldest dropped
    assert [await _replayed(idem, "quiet", f"q{i}") for i in range(3)] == [answer] * 3
    sizes = await state.hgetall(budget_keys("filler")[1])
    assert int(sizes[b"total"]) == 3 * 3065 <= 10_000
    assert await state.zcard(budget_keys("filler")[0]) == 3


@pytest.mark.asyncio
async def test_an_answer_over_the_whole_budget_is_not_stored_and_its_key_is_free(
    state: Redis,
) -> None:
    idem = Idempotency(state, ttl_s=3600, wait_s=0, team_bytes=2048)
    await _store(idem, "t", "kept", b"z" * 1000)
    await _store(idem, "t", "huge", b"z" * 5000)
    assert await _replayed(idem, "t", "huge") is None  # a retry is scored afresh
    assert await _replayed(idem, "t", "kept") == b"z" * 1000  # nothing dropped for it


@pytest.mark.asyncio
async def test_answers_past_their_ttl_no_longer_count(state: Redis) -> None:
    idem = Idempotency(state, ttl_s=1, wait_s=0, team_bytes=4096)
    await _store(idem, "t", "old", b"o" * 3000)
    await asyncio.sleep(1.2)  # the entry has expired; its bytes leave the team's total
    await _store(idem, "t", "new", b"n" * 3000)
    sizes = await state.hgetall(budget_keys("t")[1])
    assert int(sizes[b"total"]) == 3065 and len(sizes) == 2  # "new" and the total
    assert await _replayed(idem, "t", "new") == b"n" * 3000


def test_state_settings_fail_fast() -> None:
    with pytest.raises(ValidationError, match="GATEWAY_STATE_REDIS_URL"):
        GatewaySettings(state_redis_url="http://127.0.0.1:6380")
    with pytest.raises(ValidationError, match="idempotency_team_bytes"):
        GatewaySettings(idempotency_team_bytes=0)
    one = GatewaySettings(redis_url="redis://127.0.0.1:1/0")
    assert one.state_url == "redis://127.0.0.1:1/0"  # one Redis still works
    two = GatewaySettings(
        redis_url="redis://127.0.0.1:1/0", state_redis_url="redis://127.0.0.1:2/0"
    )
    assert two.state_url == "redis://127.0.0.1:2/0"
