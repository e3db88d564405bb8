"""Idempotency-Key on POST /v1/score, on real gateways and a real Redis: a retry gets the
stored answer and is counted once (usage and quota), a reused key with another body is
422, a duplicate in flight waits (or 409), keys live 24 h; the SDK and the trainer send
what the gateway accepts."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from arbiter.client import ArbiterClient, RetryPolicy
from arbiter.proto.gateway import ScoreGroup
from arbiter.trainer.rewards import RewardClient
from tests.services.gateway.conftest import RawServer
from tests.services.gateway.teams import Keys, groups, running_gateway, team_total, usage


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("idem") / "keys.yaml")
    k.add("once", "once", responses_per_minute=60)
    k.add("drop", "drop")
    k.add("drop-fast", "drop-fast")
    k.add("drop-in-flight", "drop-in-flight")
    k.add("sdk", "sdk")
    return k


@pytest.fixture(scope="module")
def gateway(log_dir: Path, verify_url: str, redis_url: str, keys: Keys) -> Iterator[str]:
    with running_gateway(log_dir, verify_url, redis_url, keys) as url:
        yield url


@pytest.fixture(scope="module")
def hung_gateway(log_dir: Path, redis_url: str, keys: Keys) -> Iterator[str]:
    """Its verify never answers: a request stays in flight for the 1.5 s component deadline."""
    hung = RawServer(None)
    env = {"GATEWAY_COMPONENT_TIMEOUT_S": "1.5", "GATEWAY_IDEMPOTENCY_WAIT_S": "0.3"}
    with running_gateway(log_dir, hung.url, redis_url, keys, **env) as url:
        yield url
    hung.close()


def _post(url: str, body: Any, headers: dict[str, str], timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{url}/v1/score", json=body, headers=headers, timeout=timeout)


def test_a_retry_gets_the_stored_answer_and_is_counted_once(gateway: str, keys: Keys) -> None:
    body = {"recipe": "gsm8k", "groups": groups(6, 6)}  # 36 of the team's 60 a minute
    h = keys.headers("once", **{"Idempotency-Key": str(uuid.uuid4())})
    first = _post(gateway, body, h)
    again = _post(gateway, body, h)
    assert first.status_code == again.status_code == 200, again.text
    assert again.content == first.content  # byte for byte, elapsed_ms included
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    # counted once in the quota (36 + 36 would be over 60) and in the ledger
    report = usage(gateway, keys.headers("once"))
    assert team_total(report, "once", "requests") == 1
    assert team_total(report, "once", "responses") == 36
    assert team_total(report, "once", "idempotent_replays") == 1
    other = _post(gateway, body, keys.headers("once", **{"Idempotency-Key": "another"}))
    assert other.status_code == 429  # a new key is a new request: over the quota


def test_the_same_key_with_another_body_is_422(gateway: str, keys: Keys) -> None:
    h = keys.headers("drop", **{"Idempotency-Key": str(uuid.uuid4())})
    assert _post(gateway, {"recipe": "gsm8k", "groups": groups(1, 1)}, h).status_code == 200
    r = _post(gateway, {"recipe": "gsm8k", "groups": groups(1, 1)}, h)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "idempotency_key_reused"
    assert r.json()["error"]["param"] == "Idempotency-Key"
    bad = _post(
        gateway, {"recipe": "gsm8k", "groups": groups(1, 1)}, {**h, "Idempotency-Key": "x" * 300}
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_idempotency_key"


def _send_and_drop(url: str, body: bytes, headers: dict[str, str]) -> None:
    """Send a whole request on a raw socket and close it without reading the answer."""
    parts = urlsplit(url)
    head = f"POST /v1/score HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-type: application/json\r\n"
    head += f"content-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((parts.hostname, parts.port)) as s:
        s.sendall(head.encode() + b"\r\n" + body)


@pytest.mark.parametrize("where", ["fast", "in flight"])
def test_a_retry_after_a_dropped_connection_is_counted_once(
    gateway: str, hung_gateway: str, keys: Keys, where: str
) -> None:
    # fast: the first try may finish before the gateway notices the drop (then the retry is
    # a replay); in flight: its component hangs, so the drop cancels it and releases the key.
    url = gateway if where == "fast" else hung_gateway
    team = f"drop-{where.replace(' ', '-')}"
    before = team_total(usage(url, keys.headers(team)), team, "requests")
    body = {"recipe": "gsm8k", "groups": groups(2, 3)}
    h = keys.headers(team, **{"Idempotency-Key": str(uuid.uuid4())})
    raw = json.dumps(body).encode()  # a retry sends the same bytes (the SDK and trainer do)
    _send_and_drop(url, raw, h)
    h["Content-Type"] = "application/json"
    r = httpx.post(f"{url}/v1/score", content=raw, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    report = usage(url, keys.headers(team))
    assert team_total(report, team, "requests") - before == 1
    assert team_total(report, team, "responses") == 6


def test_a_duplicate_in_flight_waits_or_gets_409(
    gateway: str, hung_gateway: str, keys: Keys
) -> None:
    async def both(url: str) -> list[httpx.Response]:
        body = {"recipe": "gsm8k", "groups": groups(1, 2)}  # new texts: nothing cached
        h = keys.headers("sdk", **{"Idempotency-Key": str(uuid.uuid4())})
        async with httpx.AsyncClient(timeout=30) as client:
            first = asyncio.create_task(client.post(f"{url}/v1/score", json=body, headers=h))
            await asyncio.sleep(0.1)  # the first holds the key now
            second = await client.post(f"{url}/v1/score", json=body, headers=h)
            return [await first, second]

    first, second = asyncio.run(both(gateway))  # default wait (30 s): the second waits
    assert first.status_code == second.status_code == 200
    assert first.content == second.content
    first, second = asyncio.run(both(hung_gateway))  # waits 0.3 s, the first takes 1.5 s
    assert first.status_code == 200
    assert second.status_code == 409, second.text
    assert second.json()["error"]["code"] == "idempotency_in_flight"


def test_keys_expire_after_24_hours(gateway: str, redis_url: str, keys: Keys) -> None:
    h = keys.headers("sdk", **{"Idempotency-Key": "ttl-" + str(uuid.uuid4())})
    assert _post(gateway, {"recipe": "gsm8k", "groups": groups(1, 1)}, h).status_code == 200
    client = redis.Redis.from_url(redis_url)
    ttls = [client.ttl(k) for k in client.scan_iter("arb:idem:v1:sdk:*")]
    client.close()
    assert ttls and all(86_000 < t <= 86_400 for t in ttls)


def test_without_auth_idempotency_still_works(gateway_url: str) -> None:
    h = {"Idempotency-Key": str(uuid.uuid4())}
    body = {"recipe": "gsm8k", "groups": groups(1, 2)}
    first, again = _post(gateway_url, body, h), _post(gateway_url, body, h)
    assert first.content == again.content and again.headers["idempotent-replayed"] == "true"


def test_sdk_and_trainer_send_the_key_and_idempotency_key(
    gateway: str, redis_url: str, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = redis.Redis.from_url(redis_url)

    def stored() -> int:  # answers kept under the team's Idempotency-Keys
        return sum(1 for _ in store.scan_iter("arb:idem:v1:sdk:*"))

    gs = groups(2, 2)
    with ArbiterClient(gateway, api_key=keys.keys["sdk"]) as client:
        out = client.score(gs, "gsm8k", idempotency_key="sdk-call-1")
        again = client.score(gs, "gsm8k", idempotency_key="sdk-call-1")  # a retry of it
    assert out == again
    with pytest.raises(Exception, match="401"):
        ArbiterClient(gateway, api_key="").score(gs, "gsm8k")
    monkeypatch.setenv("ARBITER_API_KEY", keys.keys["sdk"])  # the trainer reads the env
    before = stored()
    with RewardClient(ArbiterClient(gateway, retry=RetryPolicy(attempts=1))) as rewards:
        batch = rewards.score("gsm8k", [ScoreGroup.model_validate(g) for g in gs])
    assert len(batch.groups) == 2
    assert stored() - before == 2  # one request per group, each with its own key
    store.close()
    report = usage(gateway, keys.headers("sdk"))
    assert team_total(report, "sdk", "idempotent_replays") >= 1
