"""The ``openreward`` SDK's own client runs an episode through the gateway's ``/ors``.

The SDK pulls in heavy dependencies (anthropic, google-genai, openai, OpenTelemetry), so it
is not in the project's venv: ``ARBITER_OPENREWARD_PYTHON`` names a Python that has it
(``python -m venv /tmp/orvenv && /tmp/orvenv/bin/pip install openreward``); without it the
test is skipped, and ``test_ors_curl.py`` still drives ``/ors`` with a client of no
project code. The episode script is ``ors_sdk_episode.py`` (what it adapts, and why).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.services.gateway.envs_stack import EnvsStack, envs_stack, first_task
from tests.services.gateway.teams import wait_for

__all__ = ["envs_stack"]

PYTHON = os.environ.get("ARBITER_OPENREWARD_PYTHON", "")
SCRIPT = Path(__file__).with_name("ors_sdk_episode.py")


def _has_sdk() -> bool:
    if not PYTHON or not Path(PYTHON).exists():
        return False
    found = subprocess.run([PYTHON, "-c", "import openreward"], capture_output=True, timeout=60)
    return found.returncode == 0


@pytest.mark.skipif(not _has_sdk(), reason="ARBITER_OPENREWARD_PYTHON has no openreward SDK")
def test_openreward_sdk_runs_an_episode_through_the_gateway(envs_stack: EnvsStack) -> None:
    task = first_task(envs_stack, "math")
    key = envs_stack.keys.keys["alpha"]
    run = subprocess.run(
        [PYTHON, str(SCRIPT), envs_stack.gateway, key, json.dumps(task)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["tools"] == ["submit"]
    assert task["question"] in out["prompt"][0]
    assert out["reward"] == 1.5 and out["finished"] is True  # gsm8k: math 1.0 + format 0.5
    assert "components" in out["metadata"]
    # the SDK's bodiless POST /delete (aiohttp sends it as application/octet-stream) ended it
    admin = envs_stack.keys.headers("admin")
    ended = 'arbiter_gateway_team_requests_total{route="/ors/delete",status="200",team="alpha"}'

    def metrics() -> str:
        return httpx.get(f"{envs_stack.gateway}/metrics", headers=admin, timeout=30).text

    text = wait_for(lambda: ended in metrics() and metrics())
    assert text, [m for m in metrics().splitlines() if "/ors/" in m and "_total{" in m]
