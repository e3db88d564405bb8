"""The environments as NeMo Gym resources servers: ``/nemo-gym/envs/{env}/...`` on the
real stack (``envs_stack``).

NeMo Gym needs Python >= 3.13 and does not install here; the calls are those of its
``responses_api_agents/simple_agent/app.py``: ``POST /seed_session`` with the dataset row
(``body.model_dump()``), then ``POST /{function_call.name}`` with the parsed arguments for
each function call (the answer's text is what the model sees), then ``POST /verify`` with
the row and the Responses-API ``response``; each call carries the previous answer's
cookies (``cookies=api_response.cookies``), as that agent passes them.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.services.gateway.envs_stack import EnvsStack, envs_stack, first_task
from tests.services.gateway.test_compat_nemo_gym import verify_body

__all__ = ["envs_stack"]


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
