"""The field's own ORS clients against the gateway, unmodified, and ORS's resumable calls.

``openreward`` and ``ors-sdk`` from PyPI (``make ors-clients``: ``.venv-ors``, named by
``ARBITER_ORS_PYTHON``; CI sets it) run a whole episode of every environment, used exactly
as their READMEs show (``ors_clients.py``), with the gateway's URL as their base URL. The
stack's episodes are forgotten after 15 idle seconds, and one episode is held open 40 s
beside the others: the SDK's pings every 10 s keep it alive.

Then the ``task_id`` contract, with plain HTTP: the answer's first event is ``task_id``;
keep-alive comments come while a tool runs; a call sent again with its ``task_id``, while
it runs or after, gets the one run's answer (a counter cell prints 1 once, never 2), and a
resent ``submit`` its reward, not ``episode_finished``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.services.gateway.envs_stack import EnvsStack, running_envs_stack, sse_end

PYTHON = os.environ.get("ARBITER_ORS_PYTHON", "")
SCRIPT = Path(__file__).with_name("ors_clients.py")
TTL_S, HOLD_S = 15, 40
COUNTER = "import time\nn = globals().get('n', 0) + 1\ntime.sleep(2.5)\nprint(n)"
needs_clients = pytest.mark.skipif(
    not PYTHON or not Path(PYTHON).exists(),
    reason="ARBITER_ORS_PYTHON names no Python with the ORS clients (make ors-clients)",
)


@pytest.fixture(scope="module")
def stack(
    log_dir: Path, verify_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EnvsStack]:
    keys = tmp_path_factory.mktemp("ors-keys") / "keys.yaml"
    settings = {"ENVS_SESSION_TTL_S": str(TTL_S), "ENVS_SSE_KEEPALIVE_S": "1"}
    with running_envs_stack(log_dir, verify_url, redis_url, keys, **settings) as s:
        yield s


def run_client(stack: EnvsStack, client: str, base_url: str, hold_s: int = 0) -> dict[str, Any]:
    key = stack.keys.keys["alpha"]
    env = {**os.environ, "ORS_API_KEY": key, "OPENREWARD_API_KEY": key}
    run = subprocess.run(
        [PYTHON, str(SCRIPT), client, base_url, str(hold_s)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    out: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return out


@needs_clients
def test_ors_sdk_runs_every_environment_and_pings_an_episode_alive(stack: EnvsStack) -> None:
    # the script checks each episode (ors_clients.check), the held one's reward too
    out = run_client(stack, "ors-sdk", stack.gateway, hold_s=HOLD_S)
    assert out["held"]["reward"] == 1.5


@needs_clients
def test_openreward_runs_every_environment(stack: EnvsStack) -> None:
    # a base URL ending in "/": the SDK then pings "//ping", which the gateway takes as /ping
    out = run_client(stack, "openreward", stack.gateway + "/")
    assert out["python"]["observations"][:2] == ["1\n", "2\n"]


def create(stack: EnvsStack, env: str) -> tuple[dict[str, str], str]:
    key = stack.keys.headers("alpha")
    r = httpx.post(f"{stack.gateway}/create_session", headers=key, timeout=30)
    sid = r.text.split("data: ")[1].split()[0]
    headers = {**key, "X-Session-ID": sid}
    task = {"question": "2 + 2?", "answer": "4"}
    body = {"env_name": env, "task_spec": task}
    assert httpx.post(f"{stack.gateway}/create", json=body, headers=headers).status_code == 200
    return headers, sid


def call(stack: EnvsStack, headers: dict[str, str], body: dict[str, Any]) -> str:
    r = httpx.post(f"{stack.gateway}/python/call", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.text


def test_a_resent_task_id_never_runs_the_tool_twice(stack: EnvsStack) -> None:
    headers, _ = create(stack, "python")
    run = {"name": "run", "input": {"code": COUNTER}}
    # the stream is cut after its first event, as a dropped connection would cut it
    with httpx.stream(
        "POST", f"{stack.gateway}/python/call", json=run, headers=headers, timeout=60
    ) as r:
        lines = r.iter_lines()
        assert next(lines) == "event: task_id"
        task_id = next(lines).removeprefix("data: ")
    # sent again with its task_id while it runs: attached to the run, keep-alives meanwhile
    attached = call(stack, headers, {**run, "task_id": task_id})
    assert attached.startswith(f"event: task_id\ndata: {task_id}\n\n")
    assert ": keep-alive" in attached
    assert sse_end(attached)["output"]["blocks"][0]["text"] == "1\n"
    # and once more after it finished: its answer again, not a second run
    assert sse_end(call(stack, headers, {**run, "task_id": task_id})) == sse_end(attached)
    shown = call(stack, headers, {"name": "run", "input": {"code": "print(n)"}})
    assert sse_end(shown)["output"]["blocks"][0]["text"] == "1\n"  # the cell ran once
    submit = {"name": "submit", "input": {"answer": "<answer>4</answer>"}, "task_id": "s-1"}
    first = sse_end(call(stack, headers, submit))
    assert first["output"]["reward"] == 1.0 and first["output"]["finished"] is True
    assert sse_end(call(stack, headers, submit)) == first  # its reward, not episode_finished
