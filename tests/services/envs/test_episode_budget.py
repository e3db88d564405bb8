"""A team's open episodes are bounded in bytes (``ENVS_TEAM_EPISODE_BYTES``), against the
real envs service on a Redis of its own.

Guarded: a team past its budget gets 429 ``episodes_over_budget`` on ``/create`` while
another team's creates and calls go on; deleting an episode, or its idle TTL passing,
gives its bytes back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_redis
from tests.services.envs.conftest import Episodes, start_envs

BUDGET, TTL_S = 64 * 1024, 3


@pytest.fixture(scope="module")
def envs(log_dir: Path, verify_url: str) -> Iterator[str]:
    redis, redis_url = start_redis(log_dir)
    settings = {"ENVS_TEAM_EPISODE_BYTES": str(BUDGET), "ENVS_SESSION_TTL_S": str(TTL_S)}
    proc, url = start_envs(log_dir, redis_url, verify_url, None, **settings)
    yield url
    proc.stop()
    redis.stop()


def open_until_refused(e: Episodes) -> list[str]:
    """The sids a team opened until its create was refused (asserted to be the budget)."""
    sids: list[str] = []
    for _ in range(10):
        sid = e.new_sid()
        body = {"env_name": "math", "task_spec": {"question": "x" * 20_000, "answer": "1"}}
        r = e.http.post(f"{e.url}/create", json=body, headers=e.headers(sid))
        if r.status_code != 200:
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "episodes_over_budget", r.text
            assert r.headers["Retry-After"]
            return sids
        sids.append(sid)
    raise AssertionError("ten episodes of 20 KB opened within a 64 KB budget")


def test_a_team_over_its_episode_budget_is_refused_alone(envs: str) -> None:
    bulk, other = Episodes(envs, team="bulk"), Episodes(envs, team="other")
    opened = open_until_refused(bulk)
    assert len(opened) == 3
    # the other team opens, calls and finishes its episode as if nothing happened
    sid = other.create("calculator", task_spec={"question": "6 * 7?", "answer": "42"})
    assert other.call("calculator", sid, "calculate", expression="6 * 7").result["ok"]
    # the bulk team's open episodes still answer; deleting one gives its bytes back
    assert bulk.prompt("math", opened[0]).status_code == 200
    r = bulk.http.post(f"{envs}/delete", headers=bulk.headers(opened[0]))
    assert r.status_code == 200
    assert len(open_until_refused(bulk)) == 1
    # idle past the TTL, the episodes are gone, and so is their weight
    time.sleep(TTL_S + 1)
    assert len(open_until_refused(bulk)) == 3
