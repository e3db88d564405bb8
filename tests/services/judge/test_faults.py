"""Failure kinds: a judge server that is down, slow, ignores log-probs, sends 503s or
refuses structured output. Only "down" is real (a closed port); the rest need the stub
server (stub.py says why each one cannot be caused with the real vLLM)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from arbiter.procs import free_port
from arbiter.proto.components import ScoreGroup
from arbiter.proto.judge import QualityParams, QualityRequest, VerifierParams, VerifierRequest
from arbiter.services.judge.scoring import Judge
from arbiter.services.judge.settings import JudgeSettings
from tests.conftest import start_service
from tests.services.common.hostile import check_hostile_bodies
from tests.services.judge.conftest import judge_env

GROUP = {"id": "g", "prompt": "What is 6 * 7?", "reference": "42", "responses": ["42", "41"]}
TIMEOUT_S = 1.5
MARGIN_S = 5.0  # scheduling on a loaded 2-core machine (seen: 4.4 s at load 9); < the stub's 10 s


@pytest.fixture(scope="module")
def down_judge(log_dir: Path) -> Iterator[str]:
    """A judge whose server is a closed port (nothing listens there)."""
    env = judge_env(
        f"http://127.0.0.1:{free_port()}/v1", "m", timeout_s=str(TIMEOUT_S),
        max_retries="2", backoff_s="0.05",
    )  # fmt: skip
    proc, url = start_service("judge", log_dir, env)
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def slow_judge(log_dir: Path, stub_root: str) -> Iterator[str]:
    env = judge_env(f"{stub_root}/v1", "slow", timeout_s=str(TIMEOUT_S))
    proc, url = start_service("judge", log_dir, env)
    yield url
    proc.stop()


@pytest.fixture(scope="module")
def no_logprobs_judge(log_dir: Path, stub_root: str) -> Iterator[str]:
    proc, url = start_service("judge", log_dir, judge_env(f"{stub_root}/v1", "no_logprobs"))
    yield url
    proc.stop()


async def _score_both(url: str) -> tuple[dict[str, Any], dict[str, Any], float]:
    body = {"groups": [GROUP], "params": {}}
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=60) as http:
        q, v = await asyncio.gather(
            http.post(f"{url}/v1/quality", json=body), http.post(f"{url}/v1/verifier", json=body)
        )
    assert q.status_code == 200 and v.status_code == 200, (q.text, v.text)
    return q.json(), v.json(), time.monotonic() - start


@pytest.mark.parametrize(
    ("judge", "kind"),
    [
        # connection refused, retried twice with back-off, then unavailable
        ("down_judge", "unavailable"),
        # the server holds the request past the deadline: timeout
        ("slow_judge", "timeout"),
    ],
)
async def test_failure_kinds_within_deadline(
    judge: str, kind: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(judge)
    quality, verifier, elapsed = await _score_both(url)
    assert elapsed < TIMEOUT_S + MARGIN_S
    for res in (quality, verifier):
        g = res["groups"][0]
        assert g["scores"] == [None, None]
        assert [(e["index"], e["kind"]) for e in g["errors"]] == [(0, kind), (1, kind)]
        assert res["usage"]["items"] == 2 and res["usage"]["prompt_tokens"] == 0


async def test_down_server_not_ready(down_judge: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.get(f"{down_judge}/healthz")).status_code == 200
        r = await http.get(f"{down_judge}/readyz")
    assert r.status_code == 503
    # which component is down, not where: /readyz is unauthenticated
    assert r.json()["checks"]["judge_server"].startswith("unreachable (")
    assert "127.0.0.1" not in r.text and "http://" not in r.text
    quality, verifier, _ = await _score_both(down_judge)  # nor do the items' errors
    assert "127.0.0.1" not in str((quality, verifier)), (quality, verifier)


async def test_server_ignoring_logprobs(no_logprobs_judge: str) -> None:
    _, verifier, _ = await _score_both(no_logprobs_judge)
    g = verifier["groups"][0]
    assert g["scores"] == [None, None]
    assert {e["kind"] for e in g["errors"]} == {"judge_unsupported"}
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{no_logprobs_judge}/readyz")
    assert r.status_code == 503
    checks = r.json()["checks"]
    assert checks["judge_server"] == "ok" and checks["model"] == "ok"
    assert "ignores logprobs" in checks["logprobs"]


def _judge(stub_root: str, model: str, **kw: Any) -> Judge:
    return Judge(JudgeSettings(base_url=f"{stub_root}/v1", model=model, **kw))


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_retries_503_then_scores(stub_root: str) -> None:
    # two 503s per request, three attempts allowed: every item is scored
    judge = _judge(stub_root, "flaky", max_retries=2, backoff_s=0.01)
    before = _sample("arbiter_judge_upstream_retries_total", component="judge_verifier",
                     reason="unavailable")  # fmt: skip
    try:
        req = VerifierRequest(groups=[ScoreGroup(**GROUP)], params=VerifierParams())
        res = await judge.verifier(req)
    finally:
        await judge.aclose()
    assert (
        res.groups[0].scores == [pytest.approx(1 / (1 + pytest.importorskip("math").exp(-1)))] * 2
    )
    after = _sample("arbiter_judge_upstream_retries_total", component="judge_verifier",
                    reason="unavailable")  # fmt: skip
    assert after - before == 4


async def test_retries_exhausted_is_unavailable(stub_root: str) -> None:
    # one retry is not enough against two 503s: unavailable, with the server's message
    judge = _judge(stub_root, "flaky", max_retries=1, backoff_s=0.01)
    try:
        group = ScoreGroup(**{**GROUP, "prompt": "a prompt no other test sends"})
        res = await judge.verifier(VerifierRequest(groups=[group], params=VerifierParams()))
    finally:
        await judge.aclose()
    assert res.groups[0].scores == [None, None]
    assert {e.kind for e in res.groups[0].errors} == {"unavailable"}
    assert "HTTP 503: overloaded" in res.groups[0].errors[0].message


async def test_concurrency_is_bounded(stub_root: str) -> None:
    # 12 items, max_concurrency 3: never more than 3 requests at the server
    async with httpx.AsyncClient() as http:  # the stub is shared by the session's tests
        (await http.post(f"{stub_root}/stats/reset")).raise_for_status()
    judge = _judge(stub_root, "count", max_concurrency=3)
    group = ScoreGroup(**{**GROUP, "responses": [str(i) for i in range(12)]})
    try:
        res = await judge.verifier(VerifierRequest(groups=[group], params=VerifierParams()))
    finally:
        await judge.aclose()
    assert None not in res.groups[0].scores
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{stub_root}/stats")).json()
    assert stats["max_in_flight"] == 3


@pytest.mark.parametrize(
    ("mode", "score", "kind"),
    [
        # auto: the server refuses response_format, the judge asks again for text and parses
        ("auto", 0.75, None),
        # json_schema insisted on: the refusal is the item's error
        ("json_schema", None, "bad_response"),
    ],
)
async def test_structured_output_refused(
    stub_root: str, mode: str, score: float | None, kind: str | None
) -> None:
    judge = _judge(stub_root, "refuse_json", structured_output=mode)
    req = QualityRequest(groups=[ScoreGroup(**GROUP)], params=QualityParams())
    try:
        res = await judge.quality(req)
        again = await judge.quality(req)  # auto remembers: no second refusal needed
    finally:
        await judge.aclose()
    for r in (res, again):
        assert r.groups[0].scores == [score, score]
        assert [e.kind for e in r.groups[0].errors] == ([kind, kind] if kind else [])
    if score is not None:
        assert res.groups[0].info["judge"][0]["source"] == "overall_text"


@pytest.mark.parametrize("path", ["/v1/quality", "/v1/verifier"])
def test_hostile_keys_are_422_and_short(down_judge: str, path: str) -> None:
    # Refused before any call to the judge server (down here): a lone surrogate in an
    # object key was a 500 once; a 1 MB key was echoed whole.
    check_hostile_bodies(down_judge, path, {"groups": [GROUP], "params": {}}, "params")
