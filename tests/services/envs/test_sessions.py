"""Episodes' state: per team, idle TTL, kept across a restart, consistent under load; and
the failures: bad input names its field, a failure not the policy's is retryable."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.envs import SESSION_HEADER
from tests.conftest import start_service
from tests.services.envs.conftest import (
    SANDBOX_ENV,
    Episodes,
    needs_bwrap,
    parse_sse,
    sse_error,
    start_envs,
)

GSM = {"question": "What is 6 times 7?", "answer": "42"}


def test_another_teams_sid_is_not_found(episodes: Episodes, envs_url: str) -> None:
    sid = episodes.create("calculator", task_spec=GSM)
    other = Episodes(envs_url, team="team-b")
    for r in (
        other.prompt("calculator", sid),
        other.call_raw("calculator", sid, "submit", answer="42"),
        other.http.post(f"{envs_url}/ping", headers=other.headers(sid)),
    ):
        assert r.status_code == 404, r.text
        assert r.json()["error"]["param"] == SESSION_HEADER
    # deleting it as team-b touches nothing of team-a's
    other.http.post(f"{envs_url}/delete", headers=other.headers(sid))
    assert episodes.call("calculator", sid, "submit", answer="42").result["output"]["reward"] == 1


def test_session_routes_need_the_team_header(envs_url: str) -> None:
    r = httpx.post(f"{envs_url}/create_session")
    assert r.status_code == 400 and r.json()["error"]["param"] == TEAM_HEADER


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # a task_spec missing the reference
        ({"env_name": "math", "task_spec": {"question": "1+1?"}}, "task_spec.answer"),
        # code's entry point must be an identifier
        (
            {"env_name": "code", "task_spec": {"prompt": "p", "entry_point": "1x", "tests": "t"}},
            "task_spec.entry_point",
        ),
        # no such environment
        ({"env_name": "chess", "split": "test", "index": 0}, "env_name"),
        # no such split, and an index past the split
        ({"env_name": "math", "split": "dev", "index": 0}, "split"),
        ({"env_name": "code", "split": "test", "index": 10_000}, "index"),
    ],
)
def test_bad_create_names_the_field(episodes: Episodes, body: dict, param: str) -> None:
    sid = episodes.new_sid()
    r = episodes.http.post(f"{episodes.url}/create", json=body, headers=episodes.headers(sid))
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_both_task_sources_refused(episodes: Episodes) -> None:
    sid = episodes.new_sid()
    body = {"env_name": "math", "task_spec": GSM, "split": "test", "index": 0}
    r = episodes.http.post(f"{episodes.url}/create", json=body, headers=episodes.headers(sid))
    assert r.status_code == 422 and "either task_spec" in r.json()["error"]["message"]


def test_idle_episode_expires(log_dir: Path, state_redis: str, verify_url: str) -> None:
    proc, url = start_envs(log_dir, state_redis, verify_url, None, ENVS_SESSION_TTL_S="1")
    try:
        e = Episodes(url)
        sid = e.create("calculator", task_spec=GSM)
        assert e.prompt("calculator", sid).status_code == 200
        time.sleep(2.5)
        r = e.prompt("calculator", sid)
        assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    finally:
        proc.stop()


def test_restarted_process_continues_an_open_episode(
    log_dir: Path, state_redis: str, verify_url: str
) -> None:
    proc, url = start_envs(log_dir, state_redis, verify_url, None)
    e = Episodes(url)
    sid = e.create("calculator", task_spec=GSM)
    assert e.call("calculator", sid, "calculate", expression="6*7").result["ok"]
    proc.stop()
    proc, url = start_envs(log_dir, state_redis, verify_url, None)
    try:
        e = Episodes(url)
        done = e.call("calculator", sid, "submit", answer="42")
        assert done.result["output"]["reward"] == 1.0
    finally:
        proc.stop()


def test_256_concurrent_calculator_episodes(envs_url: str) -> None:
    async def episode(client: httpx.AsyncClient, i: int) -> float | None:
        h = {TEAM_HEADER: f"team-{i % 4}"}
        r = await client.post("/create_session", headers=h)
        sid = parse_sse(r.text)[0][1]
        h[SESSION_HEADER] = sid
        spec = {"question": f"What is {i} plus {i}?", "answer": str(2 * i)}
        r = await client.post("/create", json={"env_name": "calculator", "task_spec": spec},
                              headers=h)  # fmt: skip
        assert r.status_code == 200, r.text
        calc = {"name": "calculate", "input": {"expression": f"{i} + {i}"}}
        r = await client.post("/calculator/call", json=calc, headers=h)
        value = parse_sse(r.text)[-1][1]
        answer = {"name": "submit", "input": {"answer": value.split('"text":"')[1].split('"')[0]}}
        r = await client.post("/calculator/call", json=answer, headers=h)
        assert r.status_code == 200, r.text
        result = json.loads("".join(d for e, d in parse_sse(r.text)[1:]))
        reward: float | None = result["output"]["reward"]
        return reward

    async def main() -> list[float | None]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=envs_url, timeout=120, limits=limits) as client:
            return await asyncio.gather(*(episode(client, i) for i in range(256)))

    rewards = asyncio.run(main())
    assert rewards == [1.0] * 256


@needs_bwrap
def test_sandbox_down_is_retryable_never_zero(
    log_dir: Path, state_redis: str, verify_url: str
) -> None:
    sandbox, sandbox_url = start_service("sandbox", log_dir, SANDBOX_ENV)
    proc, url = start_envs(log_dir, state_redis, verify_url, sandbox_url)
    try:
        e = Episodes(url)
        sid = e.create("code", split="test", index=1)
        sandbox.stop()
        code = "def truncate_number(number):\n    return number % 1.0\n"
        r = e.call_raw("code", sid, "submit", code=code)
        assert r.status_code == 200, r.text  # the stream had begun: the error is in it
        status, envelope = sse_error(r.text)
        assert status == 503 and envelope["error"]["type"] != "invalid_request_error"
        # no end, no error event: an ORS client sends the call again with its task_id
        [(event, task_id)] = parse_sse(r.text)
        assert event == "task_id"
        # the failed submit did not end the episode: sent again, it runs again
        call = {"name": "submit", "input": {"code": code}, "task_id": task_id}
        again = e.http.post(f"{url}/code/call", json=call, headers=e.headers(sid))
        assert sse_error(again.text)[0] == 503 and "finished" not in again.text
    finally:
        sandbox.stop()
        proc.stop()


def test_bodiless_posts_as_aiohttp_sends_them(episodes: Episodes, envs_url: str) -> None:
    # the openreward SDK's /ping and /delete: no body, labelled application/octet-stream
    sid = episodes.create("calculator", task_spec=GSM)
    h = {**episodes.headers(sid), "content-type": "application/octet-stream"}
    assert httpx.post(f"{envs_url}/ping", headers=h).json() == {"status": "ok"}
    assert httpx.post(f"{envs_url}/delete", headers=h).json() == {"sid": sid}
    assert httpx.post(f"{envs_url}/ping", headers=h).status_code == 404


def test_concurrent_submits_on_one_episode_score_once(episodes: Episodes, envs_url: str) -> None:
    sid = episodes.create("calculator", task_spec=GSM)
    headers = episodes.headers(sid)
    submit = {"name": "submit", "input": {"answer": "42"}}

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=envs_url, timeout=60) as client:
            calls = (
                client.post("/calculator/call", json=submit, headers=headers) for _ in range(8)
            )
            return await asyncio.gather(*calls)

    answers = asyncio.run(main())
    scored = [r for r in answers if r.status_code == 200 and '"ok":true' in r.text]
    assert len(scored) == 1  # calls on one episode take turns: the others find it finished
    for r in answers:
        if r is not scored[0]:
            assert r.status_code == 200 and "episode_finished" in r.text, r.text
