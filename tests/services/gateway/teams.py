"""Helpers for the teams tests: a keys file, gateways that read it, and small requests.

Every gateway here is a real ``arbiter serve gateway`` process with ``GATEWAY_KEYS_FILE``,
on the session's verify service and a real Redis; keys are made with ``arbiter.keys`` as
``arbiter keys create`` makes them, hashed with a test secret the gateway is given too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from arbiter.keys import Team, create, load, save
from arbiter.procs import ManagedProcess
from tests.conftest import start_service

SECRET = "test-secret-" + "x" * 32


@dataclass
class Keys:
    """A keys file and the keys created in it, by label."""

    path: Path
    keys: dict[str, str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)

    def add(self, label: str, team: str, admin: bool = False, **limits: Any) -> str:
        key, record = create(
            self.path, team, secret=SECRET, admin=admin, name=label, limits=limits or None
        )
        self.keys[label] = key
        self.ids[label] = record.id
        return key

    def set_team(self, team: str, **limits: Any) -> None:
        doc = load(self.path)
        doc.teams[team] = Team.model_validate(limits)
        save(self.path, doc)

    def headers(self, label: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[label]}", **extra}


def start_gateway(
    log_dir: Path, verify_url: str, redis_url: str, keys: Keys, **env: str
) -> tuple[ManagedProcess, str]:
    return start_service(
        "gateway",
        log_dir,
        {
            "GATEWAY_VERIFY_URL": verify_url,
            "REDIS_URL": redis_url,
            "GATEWAY_KEYS_FILE": str(keys.path),
            "GATEWAY_KEY_SECRET": SECRET,
            "GATEWAY_ENVIRONMENT": "production",
            "GATEWAY_KEYS_RELOAD_S": "0.2",
            **env,
        },
    )


@contextmanager
def running_gateway(
    log_dir: Path, verify_url: str, redis_url: str, keys: Keys, **env: str
) -> Iterator[str]:
    """A gateway (``start_gateway``) for the ``with`` block: its URL; stopped on the way out."""
    proc, url = start_gateway(log_dir, verify_url, redis_url, keys, **env)
    try:
        yield url
    finally:
        proc.stop()


def groups(n: int, responses: int = 1, tag: str = "") -> list[dict[str, Any]]:
    """``n`` groups of ``responses`` distinct responses each (every text new, unless the
    same ``tag`` is used again)."""
    tag = tag or uuid.uuid4().hex[:8]
    return [
        {
            "id": f"g{i}",
            "prompt": f"{tag}: what is {i} + 1?",
            "reference": str(i + 1),
            "responses": [
                f"<think>{tag} {j}</think><answer>{i + 1 + j}</answer>" for j in range(responses)
            ],
        }
        for i in range(n)
    ]


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    """Poll ``predicate`` until it returns a truthy value (the keys file reloads)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def post(
    url: str, body: dict[str, Any], headers: dict[str, str], path: str = "/v1/score"
) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60)


def usage(url: str, headers: dict[str, str], **params: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/usage", params=params, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def team_total(report: dict[str, Any], team: str, field_name: str) -> int:
    return sum(int(d.get(field_name, 0)) for d in report["days"] if d["team"] == team)
