"""What a deployment shared by many teams meets every day. One
team's stalled uploads, its hundreds of concurrent requests, its disconnect loops and its
failing compat calls must not turn another team away, make it wait, or escape the quota.

Real processes: gateways with keys (``arbiter serve gateway``), Redis, and a verify
service of its own whose ``STUCK`` item holds a pool worker for its whole deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import free_port
from tests.conftest import start_service
from tests.services.gateway.teams import Keys, groups, post, start_gateway, team_total, usage

DEADLINE_S = 2.0  # the verify item deadline here
MARGIN_S = 4.0  # process kill + replacement + HTTP, on a loaded 2-core machine
STUCK = "\\boxed{7^{123456789}}"  # holds a worker for its whole deadline
RPM = 60


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("shared") / "keys.yaml")
    k.add("a", "team-a")
    k.add("b", "team-b")
    k.add("quota", "quota", responses_per_minute=RPM)
    k.add("compat", "compat", responses_per_minute=RPM)
    k.add("admin", "ops", admin=True)
    return k


@pytest.fixture(scope="module")
def strict_verify(log_dir: Path) -> Iterator[str]:
    env = {
        "VERIFY_WORKERS": "2",
        "VERIFY_DEADLINE_S": str(DEADLINE_S),
        "VERIFY_MATH_VERIFY_TIMEOUT_S": "30",
        "VERIFY_FAST_PATH": "false",
    }
    proc, url = start_service("verify", log_dir, env)
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def gateway(log_dir: Path, strict_verify: str, redis_url: str, keys: Keys) -> Iterator[str]:
    proc, url = start_gateway(
        log_dir, strict_verify, redis_url, keys, GATEWAY_CACHE_ENABLED="false"
    )
    yield url
    proc.stop()


def _pool_items(verify: str) -> float:
    text = httpx.get(f"{verify}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith("verify_pool_items_run_total "))
    return float(line.split()[1])


async def test_many_requests_of_one_team_do_not_hold_another_team(gateway: str, keys: Keys) -> None:
    # Finding 3: 70 concurrent one-group requests of team A x 6 slow LaTeX responses (as
    # OpenRLHF and slime send: one sample per POST, hundreds at once). Team B's one-response
    # request waited 10.8 s, behind every one of A's calls at the gateway and at verify;
    # the bound is one item's deadline, whatever A sends.
    body_a = {"recipe": "gsm8k", "groups": [{"reference": "3", "responses": [STUCK] * 6}]}
    limits = httpx.Limits(max_connections=100)
    async with (
        httpx.AsyncClient(timeout=300, limits=limits, headers=keys.headers("a")) as a,
        httpx.AsyncClient(timeout=60, headers=keys.headers("b")) as b,
    ):
        hogs = [asyncio.create_task(a.post(f"{gateway}/v1/score", json=body_a)) for _ in range(70)]
        await asyncio.sleep(1.0)  # A's requests are in: both verify workers are held
        start = time.monotonic()
        body_b = {"recipe": "gsm8k", "groups": [{"reference": "4", "responses": ["\\boxed{4}"]}]}
        r = await b.post(f"{gateway}/v1/score", json=body_b)
        elapsed = time.monotonic() - start
        done = [h.result() if not h.exception() else h.exception() for h in hogs if h.done()]
        pending = 70 - len(done)
        for h in hogs:
            h.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
    assert r.status_code == 200, r.text
    assert r.json()["groups"][0]["rewards"] == [1.0]
    assert elapsed < DEADLINE_S + MARGIN_S, f"team B waited {elapsed:.1f} s"
    # A's requests were still being scored: B did not wait for them
    assert pending >= 60, [getattr(d, "text", d) for d in done][:3]


def test_a_disconnect_loop_cannot_outspend_the_quota(
    gateway: str, strict_verify: str, keys: Keys
) -> None:
    # Finding 4: 10 requests of 60 responses (the whole quota each), each abandoned after
    # half a second. Every one was refunded, verify ran 213 items, and a 50-response
    # request right after was admitted. Charging what was started bounds the compute.
    h = keys.headers("quota")
    slow = [STUCK] * 2 + [f"\\boxed{{\\sqrt{{{i * i}}}}}" for i in range(58)]  # > 2 s
    body = {"recipe": "gsm8k", "groups": [{"reference": "1", "responses": slow}]}
    before = _pool_items(strict_verify)
    start = time.monotonic()
    statuses: list[int | str] = []
    for _ in range(10):
        try:
            r = httpx.post(f"{gateway}/v1/score", json=body, headers=h, timeout=0.5)
            statuses.append(r.status_code)
        except httpx.TimeoutException:
            statuses.append("left")
    elapsed = time.monotonic() - start
    assert statuses[0] == "left" and set(statuses[1:]) == {429}, statuses
    after = post(gateway, {"recipe": "gsm8k", "groups": groups(1, 50)}, h)
    assert after.status_code == 429, after.text  # the abandoned work was charged
    # What was charged is what started, and no more than the quota allows.
    refill = RPM * (time.monotonic() - start) / 60
    report = usage(gateway, keys.headers("admin"), team="quota")
    charged = team_total(report, "quota", "unanswered_responses")
    assert team_total(report, "quota", "unanswered") == 1
    assert 0 < charged <= RPM
    assert _pool_items(strict_verify) - before <= RPM + refill, elapsed


@pytest.fixture(scope="module")
def dead_gateway(log_dir: Path, redis_url: str, keys: Keys) -> Iterator[str]:
    """A gateway whose verify service is down (nothing listens on its port)."""
    dead = f"http://127.0.0.1:{free_port()}"
    proc, url = start_gateway(log_dir, dead, redis_url, keys)
    yield url
    proc.stop()


def test_compat_failures_are_refunded_like_score(dead_gateway: str, keys: Keys) -> None:
    # Finding 5: 60 slime requests answered 503 (verify down) drained the team's bucket;
    # the same failures on /v1/score were refunded. Work that never reached a component
    # is given back on every route.
    h = keys.headers("compat")
    url = f"{dead_gateway}/v1/compat/slime/gsm8k"
    for i in range(RPM):
        r = httpx.post(url, json={"prompt": f"p{i}", "response": "4", "label": "4"}, headers=h)
        assert r.status_code == 503, r.text
        assert "127.0.0.1" not in r.text  # which component failed, never where it lives
    r = post(dead_gateway, {"recipe": "gsm8k", "groups": groups(1, RPM)}, h)
    assert r.status_code == 200, r.text  # the quota is whole: nothing was charged
    assert r.json()["groups"][0]["masked"] == [True] * RPM


@pytest.fixture
def upload_gateway(log_dir: Path, verify_url: str, redis_url: str, keys: Keys) -> Iterator[str]:
    env = {
        "GATEWAY_MAX_BODY_BYTES": str(1 << 20),
        "GATEWAY_MAX_BUFFERED_BYTES": str(4 << 20),  # the four uploads below fill it
        "GATEWAY_BODY_TIMEOUT_S": "3",
    }
    proc, url = start_gateway(log_dir, verify_url, redis_url, keys, **env)
    yield url
    proc.stop()


def _stall(url: str, key: str, size: int) -> socket.socket:
    """A POST announcing ``size`` bytes that sends all but the last one, then stops."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        f"POST /v1/score HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {size}\r\n\r\n"
    )
    sock.sendall(head.encode() + b" " * (size - 1))
    return sock


def _status(sock: socket.socket) -> tuple[int, bytes]:
    sock.settimeout(60)
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data.split()[1]), data


def test_stalled_uploads_of_one_team_do_not_lock_others_out(
    upload_gateway: str, keys: Keys
) -> None:
    # Finding 2: one team stalls 4 uploads of (body limit - 1) bytes; every other team got
    # 429 too_busy for as long as the sockets stayed open (>= 61 s). Now a team's bodies
    # have their own budget (half the global one) and a body must arrive within its time.
    socks = [_stall(upload_gateway, keys.keys["a"], 1 << 20) for _ in range(4)]
    try:
        body: dict[str, Any] = {"recipe": "gsm8k", "groups": groups(1, 2)}
        r = post(upload_gateway, body, keys.headers("b"))
        assert r.status_code == 200, r.text  # another team is served meanwhile
        answers = [_status(s) for s in socks]
    finally:
        for s in socks:
            s.close()
    codes = sorted(code for code, _ in answers)
    # two fit the team's budget and are cut off at the deadline; two are refused at once
    assert codes == [408, 408, 429, 429], answers
    assert all(b"body_timeout" in data for code, data in answers if code == 408)
    assert all(b"MAX_TEAM_BUFFERED_BYTES" in data for code, data in answers if code == 429)


def test_a_caller_cannot_name_its_team(gateway: str, keys: Keys) -> None:
    # The internal team header is the gateway's to set: a caller's is ignored.
    h = keys.headers("b", **{"X-Arbiter-Team": "team-a"})
    before = team_total(usage(gateway, keys.headers("admin")), "team-a", "responses")
    assert post(gateway, {"recipe": "gsm8k", "groups": groups(1, 3)}, h).status_code == 200
    report = usage(gateway, keys.headers("admin"))
    assert team_total(report, "team-a", "responses") == before
