"""The python environment's live interpreter, through the real envs service and sandbox: a
cell runs once where the cells before it ran, the episode keeps only a handle to it, and an
interpreter that is gone (closed, or lost when the sandbox restarted) is an observation
that says so, after which a fresh one starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
import redis

from arbiter.proto.common import TEAM_HEADER
from tests.conftest import start_service
from tests.services.envs.conftest import SANDBOX_ENV, Called, Episodes, start_envs

GSM = {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "#### 7"}
COUNTER = "n = globals().get('n', 0) + 1\nprint(n)"
LOST = "[this episode's Python interpreter is gone"


def tool_state(state_redis: str, team: str, sid: str) -> dict[str, str]:
    with redis.Redis.from_url(state_redis, decode_responses=True) as r:
        state = json.loads(r.hget(f"arbiter:envs:{team}:{sid}", "state") or "{}")
    assert "cells" not in state
    found: dict[str, str] = state["tool_state"]
    return found


def text(called: Called) -> str:
    shown: str = called.result["output"]["blocks"][0]["text"]
    return shown


def test_a_counter_cell_runs_once_a_call(episodes: Episodes, state_redis: str) -> None:
    sid = episodes.create("python", task_spec=GSM)
    runs = [episodes.call("python", sid, "run", code=COUNTER) for _ in range(3)]
    assert [text(r) for r in runs] == ["1\n", "2\n", "3\n"]
    # each call is charged its own cell's CPU, not the episode's so far
    assert all(0 < r.usage["sandbox_cpu_ms"] < 1000 for r in runs), [r.usage for r in runs]
    handle = tool_state(state_redis, episodes.team, sid)
    assert set(handle) == {"interpreter", "replica"} and handle["interpreter"]


def test_a_closed_interpreter_is_an_observation_then_a_fresh_one(
    episodes: Episodes, state_redis: str, sandbox_url: str
) -> None:
    sid = episodes.create("python", task_spec=GSM)
    episodes.call("python", sid, "run", code="x = 1")
    handle = tool_state(state_redis, episodes.team, sid)["interpreter"]
    closed = httpx.delete(
        f"{sandbox_url}/v1/sessions/{handle}", headers={TEAM_HEADER: episodes.team}
    )
    assert closed.status_code == 200, closed.text
    lost = episodes.call("python", sid, "run", code="print(x)")
    assert lost.result["ok"] and text(lost).startswith(LOST)
    assert lost.result["output"]["metadata"] == {"status": "lost"}
    assert tool_state(state_redis, episodes.team, sid) == {}
    fresh = episodes.call("python", sid, "run", code="print('x' in globals())")
    assert text(fresh) == "False\n"


def test_deleting_the_episode_closes_its_interpreter(
    episodes: Episodes, state_redis: str, sandbox_url: str
) -> None:
    sid = episodes.create("python", task_spec=GSM)
    episodes.call("python", sid, "run", code="x = 1")
    handle = tool_state(state_redis, episodes.team, sid)["interpreter"]
    r = episodes.http.post(f"{episodes.url}/delete", headers=episodes.headers(sid))
    assert r.status_code == 200, r.text
    run = httpx.post(
        f"{sandbox_url}/v1/sessions/{handle}/run",
        json={"code": "print(x)"},
        headers={TEAM_HEADER: episodes.team},
    )
    assert run.status_code == 404 and run.json()["error"]["code"] == "session_not_found"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap here")
def test_a_sandbox_restart_loses_the_interpreter_and_the_episode_says_so(
    log_dir: Path, state_redis: str, verify_url: str
) -> None:
    sandbox, sandbox_url = start_service("sandbox", log_dir, SANDBOX_ENV)
    envs, envs_url = start_envs(log_dir, state_redis, verify_url, sandbox_url)
    e = Episodes(envs_url, team="restarts")
    try:
        sid = e.create("python", task_spec=GSM)
        assert text(e.call("python", sid, "run", code="x = 41")) == ""
        sandbox.stop()
        sandbox.start()
        sandbox.wait_ready(60)
        lost = e.call("python", sid, "run", code="print(x + 1)")
        assert text(lost).startswith(LOST) and "did not run" in text(lost)
        fresh = e.call("python", sid, "run", code="x = 41\nprint(x + 1)")
        assert text(fresh) == "42\n"
        done = e.call("python", sid, "submit", answer="7")
        assert done.result["output"]["reward"] == 1.0
    finally:
        e.http.close()
        envs.stop()
        sandbox.stop()
