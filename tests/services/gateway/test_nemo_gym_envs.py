"""The environments as NeMo Gym resources servers: ``/nemo-gym/envs/{env}/...`` on the
real stack (``envs_stack``).

An agent's calls are those of NeMo Gym's ``responses_api_agents/simple_agent/app.py``:
``POST /seed_session`` with the dataset row (``body.model_dump()``), then ``POST
/{function_call.name}`` with the parsed arguments for each function call (the answer's text
is what the model sees), then ``POST /verify`` with the row and the Responses-API
``response``; each call carries the previous answer's cookies (``cookies=api_response.cookies``),
as that agent passes them. An Environment Server's are typed: ``seed_session`` and
``close_session`` with a ``resources_session_id``.

NeMo Gym 0.7.0 asks for Python 3.13, so its own checks run in a venv of their own (``make
nemo-gym``, ``ARBITER_NEMO_GYM_PYTHON``): ``nemo_gym_checks.py`` runs its session-contract
checker, ``reverify_mode`` and ``aggregate_metrics`` against this stack's gateway.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.services.gateway.envs_stack import EnvsStack, envs_stack, first_task
from tests.services.gateway.test_compat_nemo_gym import verify_body

__all__ = ["envs_stack"]

NEMO_GYM_PYTHON = os.environ.get("ARBITER_NEMO_GYM_PYTHON", "")
CHECKS = Path(__file__).with_name("nemo_gym_checks.py")


class Agent:
    """simple_agent's calls to one resources server, cookies carried from answer to answer."""

    def __init__(self, stack: EnvsStack, env: str, label: str = "alpha"):
        self.url = f"{stack.gateway}/nemo-gym/envs/{env}"
        self.headers = stack.keys.headers(label)
        self.cookies: httpx.Cookies = httpx.Cookies()

    def post(self, path: str, body: Any) -> httpx.Response:
        r = httpx.post(
            f"{self.url}/{path}", json=body, headers=self.headers, cookies=self.cookies, timeout=60
        )
        self.cookies = httpx.Cookies(r.cookies) if r.cookies else self.cookies
        return r


def row(task: dict[str, Any], output_text: str) -> dict[str, Any]:
    """A NeMo Gym verify request whose dataset row holds the task's fields."""
    body = verify_body(task["question"], task["answer"], output_text)
    return body


def test_calculator_episode_is_verified_from_the_final_text(envs_stack: EnvsStack) -> None:
    task = first_task(envs_stack, "calculator")
    answer = task["answer"].split("####")[-1].strip().replace(",", "")
    agent = Agent(envs_stack, "calculator")
    seed = verify_body(task["question"], task["answer"], "")
    del seed["response"]
    r = agent.post("seed_session", seed)
    assert r.status_code == 200, r.text
    assert "arbiter_env_session" in r.cookies
    r = agent.post("calculate", {"expression": "16 - 3 - 4"})  # the model's function call
    assert r.status_code == 200, r.text
    assert r.json()["ok"] and "9" in r.json()["output"]["blocks"][0]["text"]
    body = row(task, f"The answer is {answer}.")
    r = agent.post("verify", body)
    assert r.status_code == 200, r.text
    out = r.json()
    for key in ("responses_create_params", "response", "question", "expected_answer"):
        assert out[key] == body[key], key  # the request echoed
    assert out["reward"] == 1.0  # the gsm8k recipe: a bare answer earns no format
    assert out["reward_components"] == {"math_accuracy": 1.0, "format": 0.0}
    assert out["mask_sample"] is False and out["failure_kind"] is None


def test_a_submit_tool_call_finishes_the_episode_and_verify_returns_its_reward(
    envs_stack: EnvsStack,
) -> None:
    task = first_task(envs_stack, "math")
    answer = task["answer"].split("####")[-1].strip().replace(",", "")
    agent = Agent(envs_stack, "math")
    seed = {"responses_create_params": {"input": []}, "task_spec": task}
    assert agent.post("seed_session", seed).status_code == 200
    r = agent.post("submit", {"answer": f"<think>t</think><answer>{answer}</answer>"})
    assert r.status_code == 200 and r.json()["output"]["finished"] is True
    # the tool call scored the episode; verify answers that, whatever the final text says
    r = agent.post("verify", row(task, "no answer here"))
    assert r.status_code == 200, r.text
    assert r.json()["reward"] == 1.5
    assert r.json()["reward_components"] == {"math_accuracy": 1.0, "format": 1.0}


def test_bad_tool_input_is_the_models_observation(envs_stack: EnvsStack) -> None:
    task = first_task(envs_stack, "calculator")
    agent = Agent(envs_stack, "calculator")
    assert agent.post("seed_session", {"task_spec": task}).status_code == 200
    r = agent.post("calculate", {"expression": "__import__('os')"})
    assert r.status_code == 200  # NeMo Gym shows the model a tool's error; not a fault
    assert r.json()["output"]["blocks"][0]["text"].startswith("error:")
    r = agent.post("calculate", {"expr": "1 + 1"})  # not the tool's schema
    assert r.status_code == 200
    assert r.json()["ok"] is False and r.json()["reason"] == "input_validation"
    r = agent.post("no_such_tool", {})
    assert r.status_code == 200 and r.json()["reason"] == "not_found"
    r = agent.post("close_session", {})  # an agent's close: the cookie's episode
    assert r.status_code == 200 and r.json() == {}
    assert agent.post("calculate", {"expression": "1 + 1"}).status_code == 404


def test_sessions_are_the_keys_teams_and_need_a_cookie(envs_stack: EnvsStack) -> None:
    task = first_task(envs_stack, "calculator")
    alpha = Agent(envs_stack, "calculator", "alpha")
    assert alpha.post("seed_session", {"task_spec": task}).status_code == 200
    beta = Agent(envs_stack, "calculator", "beta")
    beta.cookies = alpha.cookies  # alpha's session id, sent with beta's key
    r = beta.post("calculate", {"expression": "1 + 1"})
    assert r.status_code == 404, r.text
    r = Agent(envs_stack, "calculator").post("calculate", {"expression": "1 + 1"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "arbiter_env_session"
    r = Agent(envs_stack, "calculator").post("seed_session", {"responses_create_params": {}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "task_spec"
    r = httpx.post(
        f"{envs_stack.gateway}/nemo-gym/envs/calculator/seed_session",
        json={"task_spec": task},
        timeout=30,
    )
    assert r.status_code == 401
    assert json.loads(r.text)["error"]["code"] == "missing_api_key"


def typed(sid: str, rollout: str = "rollout-1", **more: Any) -> dict[str, Any]:
    """A typed body as an Environment Server sends it (``ResourcesSeedSessionRequest``
    with ``more``, or ``ResourcesCloseSessionRequest`` without)."""
    return {"resources_session_id": sid, "episode_id": {"rollout_id": rollout}, **more}


def test_typed_sessions_open_once_and_stay_closed(envs_stack: EnvsStack) -> None:
    task = first_task(envs_stack, "calculator")
    sid = f"rs-{uuid.uuid4().hex}"
    seed = typed(sid, task_id={"taskset": "arbiter:calculator", "task_id": "0"})
    seed["task_data"] = {"task_spec": task}
    agent = Agent(envs_stack, "calculator")
    r = agent.post("seed_session", seed)
    assert r.status_code == 200 and r.json() == {"resources_session_id": sid}, r.text
    assert agent.post("calculate", {"expression": "2 + 3"}).json()["ok"]  # the cookie's episode
    again = Agent(envs_stack, "calculator")
    r = again.post("seed_session", seed)  # a retry: the same session, the same episode
    assert r.status_code == 200 and r.json() == {"resources_session_id": sid}
    assert again.cookies.get("arbiter_env_session") == agent.cookies.get("arbiter_env_session")
    other = {**seed, "episode_id": {"rollout_id": "rollout-2"}}
    r = agent.post("seed_session", other)  # the id is bound to its first episode
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_exists"
    r = agent.post("close_session", typed(sid, "rollout-2"))  # not the session's episode
    assert r.status_code == 409 and r.json()["error"]["code"] == "episode_mismatch"
    for _ in range(2):  # a close, then its retry
        r = agent.post("close_session", typed(sid))
        assert r.status_code == 200 and r.json() == {"resources_session_id": sid}, r.text
    r = agent.post("calculate", {"expression": "2 + 3"})
    assert r.status_code == 404  # the episode is gone
    r = agent.post("seed_session", seed)  # closed stays closed
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_closed"
    never = f"rs-{uuid.uuid4().hex}"  # closed before its seed arrived: it never opens
    assert agent.post("close_session", typed(never)).status_code == 200
    r = agent.post("seed_session", {**seed, "resources_session_id": never})
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_closed"
    r = agent.post("seed_session", {**seed, "episode_id": {"rollout_id": "no spaces"}})
    assert r.status_code == 422 and r.json()["error"]["param"] == "episode_id.rollout_id"


def test_reverify_mode_and_aggregate_metrics(envs_stack: EnvsStack) -> None:
    agent = Agent(envs_stack, "calculator")
    r = httpx.get(f"{agent.url}/reverify_mode", headers=agent.headers, timeout=30)
    assert r.status_code == 200 and r.json() == "unsupported"  # a reward is its episode's
    run = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "mask_sample": False},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "mask_sample": False},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "mask_sample": True},
    ]
    r = agent.post("aggregate_metrics", {"verify_responses": run})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["key_metrics"] == {  # the masked sample is counted, not averaged
        "mean/reward": 0.5,
        "coverage/measured_rollouts": 2,
        "coverage/masked_rollouts": 1,
        "coverage/measured_tasks": 1,
        "coverage/fully_masked_tasks": 1,
    }
    assert [g["_ng_task_index"] for g in out["group_level_metrics"]] == [0]
    assert out["agent_metrics"]["num_repeats"] == 2
    assert len(out["repeat_level_metrics"]) == 2 and out["perf_summary"] is None


def _has_nemo_gym() -> bool:
    if not NEMO_GYM_PYTHON or not Path(NEMO_GYM_PYTHON).exists():
        return False
    # found, not imported: importing NeMo Gym takes seconds, and the test itself does it
    check = "import importlib.util as u; assert u.find_spec('nemo_gym.testing')"
    found = subprocess.run([NEMO_GYM_PYTHON, "-c", check], capture_output=True, timeout=60)
    return found.returncode == 0


@pytest.mark.skipif(not _has_nemo_gym(), reason="ARBITER_NEMO_GYM_PYTHON has no nemo-gym")
def test_nemo_gyms_own_checks_pass(envs_stack: EnvsStack) -> None:
    task = first_task(envs_stack, "calculator")
    key = envs_stack.keys.keys["alpha"]
    run = subprocess.run(
        [NEMO_GYM_PYTHON, str(CHECKS), envs_stack.gateway, key, "calculator", json.dumps(task)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["session_contract"] == "passed"  # check_resources_session_contract, keeps_state
    assert out["reverify_mode"] == "unsupported"
    assert out["aggregate_runs"] == 28 and out["aggregate_differences"] == []
