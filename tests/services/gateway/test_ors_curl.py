"""An episode through the gateway's ``/ors`` with curl: the ORS wire, no project code on the
client side (the commands the docs show). The SSE body of a tool call is read as curl
prints it, and its ``end`` event holds the ``ToolOutput`` with the reward."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.services.gateway.envs_stack import EnvsStack, envs_stack, first_task, sse_end

__all__ = ["envs_stack"]


def curl(*args: str) -> str:
    run = subprocess.run(
        ["curl", "-sS", "--fail-with-body", *args], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_runs_a_calculator_episode(envs_stack: EnvsStack) -> None:
    ors = f"{envs_stack.gateway}/ors"
    key = ("-H", f"Authorization: Bearer {envs_stack.keys.keys['alpha']}")
    task = first_task(envs_stack, "calculator")
    answer = task["answer"].split("####")[-1].strip().replace(",", "")
    created = curl("-X", "POST", *key, f"{ors}/create_session")
    sid = created.split("event: task_id")[1].split("data: ")[1].split()[0]
    session = ("-H", f"X-Session-ID: {sid}", "-H", "Content-Type: application/json")
    curl(*key, *session, "-d", json.dumps({"env_name": "calculator", "task_spec": task}),
         f"{ors}/create")  # fmt: skip
    prompt = json.loads(curl(*key, *session, f"{ors}/calculator/prompt"))
    assert task["question"] in prompt[0]["text"]
    step = {"name": "calculate", "input": {"expression": "(2 + 3) * 4"}}
    out = sse_end(curl(*key, *session, "-d", json.dumps(step), f"{ors}/calculator/call"))
    assert out["ok"] and "20" in out["output"]["blocks"][0]["text"]
    submit = {"name": "submit", "input": {"answer": answer}}
    out = sse_end(curl(*key, *session, "-d", json.dumps(submit), f"{ors}/calculator/call"))
    assert out["output"]["reward"] == 1.0 and out["output"]["finished"] is True
    curl("-X", "POST", *key, *session, f"{ors}/delete")
