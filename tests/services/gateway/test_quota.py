"""Per-team quotas on real gateway processes and a real Redis: 429 with Retry-After, then
recovery; two gateways sharing one Redis enforce one budget; judge tokens charged after."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from arbiter.client import ArbiterClient, RetryPolicy
from arbiter.errors import RateLimited
from arbiter.keys import Principal, Team
from arbiter.procs import ManagedProcess
from arbiter.proto.gateway import ScoreGroup
from arbiter.services.gateway.quota import Quota
from arbiter.trainer.rewards import RewardClient
from tests.services.gateway.teams import Keys, groups, post, start_gateway, team_total, usage

RPM = 60  # a small rate (1 response a second) so that recovery takes seconds


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("quota") / "keys.yaml")
    k.add("solo", "solo", responses_per_minute=RPM)
    k.add("pair", "pair", responses_per_minute=RPM)
    k.add("free", "free")  # no quota
    k.add("trainer", "trainer", responses_per_minute=RPM)
    return k


@pytest.fixture(scope="module")
def gateways(log_dir: Path, verify_url: str, redis_url: str, keys: Keys) -> Iterator[list[str]]:
    """Two gateway processes on one Redis, like two replicas behind a load balancer."""
    started: list[ManagedProcess] = []
    urls = []
    try:
        for _ in range(2):
            proc, url = start_gateway(log_dir, verify_url, redis_url, keys)
            started.append(proc)
            urls.append(url)
        yield urls
    finally:
        for proc in started:
            proc.stop()


def test_exhaustion_answers_429_with_retry_after_then_recovers(
    gateways: list[str], keys: Keys
) -> None:
    url, h = gateways[0], keys.headers("solo")
    assert post(url, {"recipe": "gsm8k", "groups": groups(10, 6)}, h).status_code == 200  # 60
    r = post(url, {"recipe": "gsm8k", "groups": groups(1, 3)}, h)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "quota_exceeded"
    assert r.json()["error"]["type"] == "rate_limited"
    wait = int(r.headers["retry-after"])
    assert 1 <= wait <= 3  # 3 responses at one a second, less what refilled meanwhile
    time.sleep(wait)
    assert post(url, {"recipe": "gsm8k", "groups": groups(1, 3)}, h).status_code == 200
    # the refusal is in the team's ledger, and nothing of it was scored
    report = usage(url, h)
    assert team_total(report, "solo", "rate_limited") == 1
    assert team_total(report, "solo", "responses") == 63


def test_a_request_larger_than_the_whole_quota_is_413(gateways: list[str], keys: Keys) -> None:
    r = post(gateways[0], {"recipe": "gsm8k", "groups": groups(11, 6)}, keys.headers("free"))
    assert r.status_code == 200  # no quota: anything goes
    r = post(gateways[0], {"recipe": "gsm8k", "groups": groups(11, 6)}, keys.headers("pair"))
    assert r.status_code == 413 and r.json()["error"]["code"] == "exceeds_quota", r.text


def test_two_gateways_share_one_budget(gateways: list[str], keys: Keys) -> None:
    h = keys.headers("pair")
    half = {"recipe": "gsm8k", "groups": groups(5, 6)}  # 30 responses, half the budget
    assert post(gateways[0], half, h).status_code == 200
    assert post(gateways[1], {**half, "groups": groups(5, 6)}, h).status_code == 200
    # Both replicas now see an empty bucket: 30 more would need ~30 s of refill.
    for url in gateways:
        r = post(url, {"recipe": "gsm8k", "groups": groups(5, 6)}, h)
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) > 20


async def test_judge_tokens_are_charged_after_and_block_until_refilled(redis_url: str) -> None:
    # The quota's scripts against the real Redis (a judge server is not needed to test the
    # arithmetic; test_usage.py checks the tokens the gateway reports).
    redis = Redis.from_url(redis_url)
    quota = Quota(redis)
    who = Principal("judge-team", None, False, Team(judge_tokens_per_day=86_400))  # 1/s
    try:
        await quota.take(who, 4, uses_judge=True)  # a full bucket: passes
        await quota.charge(who, 86_400 + 5)  # the judge used more than was left
        with pytest.raises(RateLimited) as refused:
            await quota.take(who, 4, uses_judge=True)
        assert refused.value.status == 429 and refused.value.code == "quota_exceeded"
        assert refused.value.retry_after is not None and 5 <= refused.value.retry_after <= 7
        await quota.take(who, 4, uses_judge=False)  # a recipe without the judge still passes
    finally:
        await redis.delete("arb:quota:v1:judge-team:judge", "arb:quota:v1:judge-team:responses")
        await redis.aclose()


def test_the_trainer_waits_out_a_429(
    gateways: list[str], keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, h = gateways[0], keys.headers("trainer")
    assert post(url, {"recipe": "gsm8k", "groups": groups(10, 6)}, h).status_code == 200  # 60
    monkeypatch.setenv("ARBITER_API_KEY", keys.keys["trainer"])
    start = time.monotonic()
    retry = RetryPolicy(attempts=4, base_delay=0.01)  # back-off alone: at most 70 ms
    with RewardClient(ArbiterClient(url, retry=retry)) as rewards:
        batch = rewards.score("gsm8k", [ScoreGroup.model_validate(g) for g in groups(1, 2)])
    assert len(batch.groups) == 1
    assert time.monotonic() - start >= 1.0  # it waited what Retry-After asked
