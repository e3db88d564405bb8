"""Sandbox test fixtures: a real ``arbiter serve sandbox`` with a secret in its environment
and a secret file beside it, and helpers to post component requests to it; another with
small session limits (``sessions``) and a client for its live interpreters.

The secret is what a hostile program must not reach: it is in the service's environment
(as the gateway's key secret would be in a shared host's) and in a file any local user
can read.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import ManagedProcess
from arbiter.proto.common import TEAM_HEADER
from tests.conftest import start_service

PROBLEMS = Path(__file__).parent / "problems" / "problems.jsonl"
# Small limits so that the hostile corpus runs in seconds.
ENV = {
    "SANDBOX_WORKERS": "2",
    "SANDBOX_TEST_TIMEOUT_S": "1",
    # a test's limit is CPU time, its wall-clock backstop 10x + 1 s: room for a few of them
    "SANDBOX_ITEM_TIMEOUT_S": "20",
    # the test host is shared: a program at niceness 19 beside other suites' work would wait
    # far past its CPU time and be judged starved (null) instead of failing on its limit
    "SANDBOX_NICE": "0",
    "SANDBOX_OUTPUT_LIMIT_BYTES": str(256 * 1024),
}


@dataclass(frozen=True)
class Sandbox:
    url: str
    secret: str
    secret_file: Path

    def post(self, path: str, body: dict[str, Any], timeout: float = 120.0) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=timeout)

    def score(
        self, component: str, groups: list[dict[str, Any]], params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        r = self.post(f"/v1/{component}", {"groups": groups, "params": params or {}})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body


@pytest.fixture(scope="session")
def sandbox(log_dir: Path) -> Iterator[Sandbox]:
    secret = "sandbox-test-secret-" + secrets.token_hex(16)
    # world-readable, in the host's /tmp: only the sandbox's own mounts keep it out of reach
    secret_file = Path("/tmp") / f"arbiter-sandbox-secret-{secrets.token_hex(4)}.txt"
    secret_file.write_text(secret)
    secret_file.chmod(0o644)
    env = {**ENV, "GATEWAY_KEY_SECRET": secret, "ARBITER_TEST_SECRET": secret}
    proc, url = start_service("sandbox", log_dir, env)
    yield Sandbox(url, secret, secret_file)
    proc.stop()
    secret_file.unlink()


def problems(shape: str | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in PROBLEMS.read_text().splitlines() if line.strip()]
    return [r for r in rows if shape is None or r["shape"] == shape]


def group(reference: str, *responses: str, prompt: str = "", gid: str = "g") -> dict[str, Any]:
    return {"id": gid, "prompt": prompt, "reference": reference, "responses": list(responses)}


# Live interpreters: 1 s of CPU a cell (SANDBOX_TEST_TIMEOUT_S caps it; 11 s of wall clock),
# three a team, six in all, closed after 4 s without a cell.
SESSION_ENV = {
    **ENV,
    "SANDBOX_WORKERS": "2",
    "SANDBOX_SPARE": "0",
    "SANDBOX_SESSION_PER_TEAM": "3",
    "SANDBOX_SESSION_MAX": "6",
    "SANDBOX_SESSION_IDLE_S": "4",
    "SANDBOX_SESSION_OUTPUT_BYTES": "1024",
}


@dataclass(frozen=True)
class Sessions:
    """The sessions API of a sandbox service, as the envs service calls it."""

    url: str
    proc: ManagedProcess

    def open(self, team: str, timeout_s: float = 1.0) -> httpx.Response:
        body = {"timeout_s": timeout_s}
        return httpx.post(f"{self.url}/v1/sessions", json=body, headers=_team(team), timeout=60)

    def opened(self, team: str) -> str:
        r = self.open(team)
        assert r.status_code == 200, r.text
        session_id: str = r.json()["id"]
        return session_id

    def run(self, team: str, session_id: str, code: str) -> httpx.Response:
        url = f"{self.url}/v1/sessions/{session_id}/run"
        return httpx.post(url, json={"code": code}, headers=_team(team), timeout=120)

    def cell(self, team: str, session_id: str, code: str) -> dict[str, Any]:
        r = self.run(team, session_id, code)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def close(self, team: str, session_id: str) -> httpx.Response:
        url = f"{self.url}/v1/sessions/{session_id}"
        return httpx.delete(url, headers=_team(team), timeout=60)


def _team(team: str) -> dict[str, str]:
    return {TEAM_HEADER: team}


@pytest.fixture(scope="session")
def sessions(log_dir: Path) -> Iterator[Sessions]:
    proc, url = start_service("sandbox", log_dir, SESSION_ENV)
    yield Sessions(url, proc)
    proc.stop()
