"""A keyed gateway in front of a real envs service: the stack the ``/ors`` and
``/nemo-gym/envs`` tests drive.

Real processes: the session's Redis (the gateway's state Redis, shared with the envs
service as a deployment shares it), its verify service, a sandbox service, an ``arbiter
serve envs`` and an ``arbiter serve gateway`` with a keys file of two teams (``alpha``,
``beta``) and an admin. ``start_gateway`` starts another gateway on the same envs service
(a lower quota, or none).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_service
from tests.services.gateway.teams import Keys, start_gateway


@dataclass
class EnvsStack:
    gateway: str  # base URL: the ORS server's (its routes are at the root, and under /ors)
    envs: str  # the envs service itself (internal)
    verify: str
    redis: str
    keys: Keys
    log_dir: Path

    @contextlib.contextmanager
    def gateway_with(self, **env: str) -> Iterator[str]:
        """Another gateway on the same envs service (and the same state Redis), with
        settings ``env``: its URL, the gateway stopped when the block ends."""
        env = {"GATEWAY_ENVS_URL": self.envs, **env}
        proc, url = start_gateway(self.log_dir, self.verify, self.redis, self.keys, **env)
        try:
            yield url
        finally:
            proc.stop()


@contextlib.contextmanager
def running_envs_stack(
    log_dir: Path, verify_url: str, redis_url: str, keys_path: Path, **envs_env: str
) -> Iterator[EnvsStack]:
    """A sandbox, an envs service (with settings ``envs_env``) and a keyed gateway in front."""
    keys = Keys(keys_path)
    keys.add("alpha", "alpha")
    keys.add("beta", "beta")
    keys.add("admin", "ops", admin=True)
    sandbox, sandbox_url = start_service("sandbox", log_dir, {"SANDBOX_WORKERS": "2"})
    envs, envs_url = start_service(
        "envs",
        log_dir,
        {
            "ENVS_STATE_REDIS_URL": redis_url,
            "ENVS_VERIFY_URL": verify_url,
            "ENVS_SANDBOX_URL": sandbox_url,
            **envs_env,
        },
    )
    gw, gw_url = start_gateway(log_dir, verify_url, redis_url, keys, GATEWAY_ENVS_URL=envs_url)
    try:
        yield EnvsStack(gw_url, envs_url, verify_url, redis_url, keys, log_dir)
    finally:
        gw.stop()
        envs.stop()
        sandbox.stop()


@pytest.fixture(scope="module")
def envs_stack(
    log_dir: Path, verify_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EnvsStack]:
    keys = tmp_path_factory.mktemp("envs-keys") / "keys.yaml"
    with running_envs_stack(log_dir, verify_url, redis_url, keys) as stack:
        yield stack


def first_task(stack: EnvsStack, env: str, split: str = "test") -> dict[str, Any]:
    """The environment's first task of ``split`` (from the envs service's open discovery)."""
    r = httpx.post(f"{stack.envs}/{env}/tasks", json={"split": split}, timeout=30)
    assert r.status_code == 200, r.text
    task: dict[str, Any] = r.json()["tasks"][0]
    return task


def sse_end(body: str) -> dict[str, Any]:
    """The JSON of an ORS SSE body's chunk and end events."""
    data, event = [], ""
    for line in body.splitlines():
        if line.startswith("event:"):
            event = line.removeprefix("event:").strip()
        elif line.startswith("data:") and event in ("chunk", "end"):
            data.append(line.removeprefix("data:").removeprefix(" "))
    out: dict[str, Any] = json.loads("".join(data))
    return out
