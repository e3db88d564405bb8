"""NeMo Gym's own checks of a resources server, run against the gateway's ``/nemo-gym/envs/{env}``.

Run by ``test_nemo_gym_envs.py`` with the NeMo Gym venv's Python (``make nemo-gym``,
``ARBITER_NEMO_GYM_PYTHON``). Usage: ``python nemo_gym_checks.py GATEWAY_URL API_KEY ENV
TASK_JSON``; prints one JSON line: what each check found.

NeMo Gym's checker (``nemo_gym.testing.session_conformance.check_resources_session_contract``)
drives a FastAPI app in process through ``TestClient``, at the app's root (``/seed_session``)
and without a key. The app it gets here is ``forwarder``: every request goes as it is (method,
body, cookies) to the live gateway under ``/nemo-gym/envs/{env}`` with the key, and every
answer comes back as it is (status, body, ``Set-Cookie``), so each assertion is decided by
the gateway's own routes, its state Redis and its envs service. A NeMo Gym deployment puts
the same few lines in front of the gateway, since NeMo Gym reaches a server by host and port
(with aiohttp, as NeMo Gym's own servers call each other).

Then, through the same app: ``GET /reverify_mode`` parsed as NeMo Gym's ``ReverifyMode``, and
``POST /aggregate_metrics`` for runs of verify responses (repeats, masked samples, usage,
``ng_perf``, bools, absent fields), each answer against NeMo Gym's own
``compute_aggregate_metrics`` with a resources server's default hooks.
"""

from __future__ import annotations

import json
import math
import random
import sys
import uuid
import warnings
from typing import Any

import aiohttp
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient
from nemo_gym.base_resources_server import (
    AggregateMetrics,
    ResourcesSeedSessionRequest,
    ReverifyMode,
)
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.reward_profile import AggregateMetricsMixin, compute_aggregate_metrics
from nemo_gym.testing.session_conformance import check_resources_session_contract


def forwarder(gateway: str, env: str, key: str) -> FastAPI:
    """An app whose every route is the gateway's ``/nemo-gym/envs/{env}/…`` (the docstring)."""
    base = f"{gateway}/nemo-gym/envs/{env}"
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        headers = {"authorization": f"Bearer {key}"}
        for name in ("content-type", "cookie"):
            if name in request.headers:
                headers[name] = request.headers[name]
        timeout = aiohttp.ClientTimeout(total=120)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(
                request.method, f"{base}/{path}", data=await request.body(), headers=headers
            ) as answer,
        ):
            out = Response(await answer.read(), answer.status)
            for name in ("Content-Type", "Set-Cookie"):
                for value in answer.headers.getall(name, []):
                    out.headers.append(name, value)
        return out

    return app


def verify_response(rnd: random.Random, task: int, rollout: int) -> dict[str, Any]:
    """A verify response as the gateway's ``verify`` answers one, stamped as NeMo Gym does."""
    out: dict[str, Any] = {
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "responses_create_params": {"input": []},
        "response": {
            "usage": {
                "input_tokens": rnd.randint(1, 50),
                "output_tokens": rnd.randint(1, 99),
                "input_tokens_details": {"cached_tokens": 0},
            }
        },
        "reward": rnd.choice([0.0, 0.5, 1.0, 1.5]),
        "math_accuracy": rnd.choice([0.0, 1.0]),
        "reward_components": {"math_accuracy": 1.0},
        "failure_kind": None,
        "mask_sample": False,
    }
    if rnd.random() < 0.3:  # a component some samples lack
        out["format"] = rnd.random()
    if rnd.random() < 0.2:  # a reward that could not be computed
        out |= {"mask_sample": True, "failure_kind": "judge_failed"}
    if rnd.random() < 0.2:
        out["flag"] = rnd.random() < 0.5
    if rnd.random() < 0.3:
        out["ng_perf"] = {
            "completion_tokens": rnd.randint(1, 100),
            "num_turns": rnd.randint(0, 4),
            "total_latency_ms": rnd.random() * 1000,
            "token_observability_coverage": rnd.random(),
        }
    return out


def runs(n: int) -> list[list[dict[str, Any]]]:
    """``n`` runs of 1 to 6 tasks with 1, 2 or 4 rollouts each (a few left out), and the
    edge cases: nothing, one response, all masked, two responses for one rollout."""
    rnd = random.Random(44)
    out: list[list[dict[str, Any]]] = []
    for _ in range(n):
        tasks, rollouts = rnd.randint(1, 6), rnd.choice([1, 2, 4])
        pairs = [(t, r) for t in range(tasks) for r in range(rollouts) if rnd.random() > 0.1]
        out.append([verify_response(rnd, t, r) for t, r in pairs])
    one = verify_response(rnd, 0, 0) | {"mask_sample": False}
    masked = [verify_response(rnd, t, 0) | {"mask_sample": True} for t in range(3)]
    out += [[], [one], masked, [one, one]]
    return out


def theirs(run: list[dict[str, Any]]) -> dict[str, Any] | None:
    """NeMo Gym's answer (``SimpleResourcesServer.aggregate_metrics``), None if it refuses."""
    hooks = AggregateMetricsMixin()
    try:
        found = compute_aggregate_metrics(
            run,
            compute_metrics_fn=hooks.compute_metrics,
            get_key_metrics_fn=hooks.get_key_metrics,
            compute_repeat_metrics_fn=hooks.compute_repeat_metrics,
        )
    except ValueError:
        return None
    out: dict[str, Any] = json.loads(json.dumps(found.model_dump(mode="json"), default=float))
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ (numbers to 1e-9), as paths."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))[:6]}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} != {len(b)} items"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ]
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and type(a) is not bool:
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a} {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main(gateway: str, key: str, env: str, task: dict[str, Any]) -> dict[str, Any]:
    app = forwarder(gateway, env, key)
    seed = ResourcesSeedSessionRequest(
        resources_session_id=f"arbiter-check-{uuid.uuid4().hex}",
        episode_id=EpisodeId(rollout_id=f"rollout-{uuid.uuid4().hex[:12]}", attempt=0),
        task_id=TaskId(taskset=f"arbiter:{env}", task_id="0"),
        task_data={"task_spec": task},
    )
    check_resources_session_contract(app, seed, keeps_state=True)  # raises when violated
    client = TestClient(app)
    mode = client.get("/reverify_mode")
    assert mode.status_code == 200, mode.text
    found: dict[str, Any] = {
        "session_contract": "passed",
        "reverify_mode": ReverifyMode(mode.json()),
    }
    cases = runs(24)
    wrong: list[str] = []
    for i, run in enumerate(cases):
        ours = client.post("/aggregate_metrics", json={"verify_responses": run})
        expected = theirs(run)
        if expected is None:  # NeMo Gym refuses the run: so must the gateway (400)
            wrong += [] if ours.status_code == 400 else [f"run {i}: {ours.status_code}"]
            continue
        if ours.status_code != 200:
            wrong.append(f"run {i}: {ours.status_code} {ours.text[:300]}")
            continue
        answer = AggregateMetrics.model_validate(ours.json()).model_dump(mode="json")
        wrong += [f"run {i}{d}" for d in differences(expected, answer)][:5]
    return found | {"aggregate_runs": len(cases), "aggregate_differences": wrong[:20]}


if __name__ == "__main__":
    warnings.simplefilter("ignore")  # pandas' and NeMo Gym's own, on every aggregation
    gateway_url, api_key, env_name, task_json = sys.argv[1:5]
    print(json.dumps(main(gateway_url, api_key, env_name, json.loads(task_json))))
