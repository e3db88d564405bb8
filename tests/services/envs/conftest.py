"""Envs test fixtures: a real ``arbiter serve envs`` on a real Redis, in front of the real
verify and sandbox services, and an ORS client over httpx (``Episodes``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import ManagedProcess
from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.envs import ERROR_COMMENT, SESSION_HEADER, USAGE_COMMENT
from tests.conftest import start_redis, start_service

SANDBOX_ENV = {
    "SANDBOX_WORKERS": "2",
    "SANDBOX_TEST_TIMEOUT_S": "5",
    "SANDBOX_ITEM_TIMEOUT_S": "30",
    "SANDBOX_NICE": "0",
}

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap here")


def parse_sse(body: str) -> list[tuple[str, str]]:
    """(event, data) pairs of an SSE body (blocks of comments alone left out)."""
    events = []
    for block in body.strip().split("\n\n"):
        if all(line.startswith(":") for line in block.splitlines()):
            continue
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields[name.rstrip(":")] = value
        events.append((fields.get("event", ""), fields.get("data", "")))
    return events


@dataclass
class Called:
    status: int
    result: dict[str, Any]  # RunToolOutput: ok, output | error, reason
    usage: dict[str, Any]
    events: list[tuple[str, str]]


class Episodes:
    """The ORS calls of one team against the envs service (as the gateway forwards them)."""

    def __init__(self, url: str, team: str = "team-a", client: httpx.Client | None = None):
        self.url = url
        self.team = team
        self.http = client or httpx.Client(timeout=120)

    def headers(self, sid: str | None = None) -> dict[str, str]:
        h = {TEAM_HEADER: self.team}
        if sid is not None:
            h[SESSION_HEADER] = sid
        return h

    def new_sid(self) -> str:
        r = self.http.post(f"{self.url}/create_session", headers=self.headers())
        assert r.status_code == 200, r.text
        events = parse_sse(r.text)
        assert events[0][0] == "task_id" and events[-1][0] == "end", events
        return events[0][1]

    def create(self, env: str, **body: Any) -> str:
        sid = self.new_sid()
        r = self.http.post(
            f"{self.url}/create", json={"env_name": env, **body}, headers=self.headers(sid)
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"sid": sid}
        return sid

    def prompt(self, env: str, sid: str) -> httpx.Response:
        return self.http.get(f"{self.url}/{env}/prompt", headers=self.headers(sid))

    def call_raw(self, env: str, sid: str, name: str, **args: Any) -> httpx.Response:
        return self.http.post(
            f"{self.url}/{env}/call",
            json={"name": name, "input": args},
            headers=self.headers(sid),
        )

    def call(self, env: str, sid: str, name: str, **args: Any) -> Called:
        r = self.call_raw(env, sid, name, **args)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(r.text)
        assert events[0][0] == "task_id", events
        assert events[-1][0] == "end", events
        result = json.loads("".join(d for e, d in events[1:] if e in ("chunk", "end")))
        return Called(r.status_code, result, sse_usage(r.text), events)


def sse_usage(body: str) -> dict[str, Any]:
    """The run's cost, from the stream's ``: arbiter-usage`` comment (the gateway's)."""
    line = next(x for x in body.splitlines() if x.startswith(USAGE_COMMENT))
    found: dict[str, Any] = json.loads(line.removeprefix(USAGE_COMMENT))
    return found


def start_envs(
    log_dir: Path, redis: str, verify: str | None, sandbox: str | None, **env: str
) -> tuple[ManagedProcess, str]:
    settings = {"ENVS_STATE_REDIS_URL": redis, "ENVS_VERIFY_URL": verify or ""}
    if sandbox:
        settings["ENVS_SANDBOX_URL"] = sandbox
    return start_service("envs", log_dir, {**settings, **env})


@pytest.fixture(scope="session")
def state_redis(log_dir: Path) -> Iterator[str]:
    proc, url = start_redis(log_dir)
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def sandbox_url(log_dir: Path) -> Iterator[str]:
    if shutil.which("bwrap") is None:
        pytest.skip("no bubblewrap here")
    proc, url = start_service("sandbox", log_dir, SANDBOX_ENV)
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def envs_url(log_dir: Path, state_redis: str, verify_url: str, sandbox_url: str) -> Iterator[str]:
    proc, url = start_envs(log_dir, state_redis, verify_url, sandbox_url, ENVS_RUN_TIMEOUT_S="2")
    yield url
    proc.stop()


@pytest.fixture
def episodes(envs_url: str) -> Iterator[Episodes]:
    e = Episodes(envs_url)
    yield e
    e.http.close()


def sse_error(body: str) -> tuple[int, dict[str, Any]]:
    """(status, envelope) of a call that did not answer: its ``: arbiter-error`` comment."""
    line = next(x for x in body.splitlines() if x.startswith(ERROR_COMMENT))
    status, _, envelope = line.removeprefix(ERROR_COMMENT).partition(" ")
    return int(status), json.loads(envelope)
