"""A full episode of every environment through the gateway's ``/ors`` with a key, twice: with
curl alone (the ORS wire, nothing of ours on the client side) and with ``arbiter.envs``. Each
episode uses a tool, then submits; the reward comes back with ``finished``."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import pytest

from arbiter.envs import EnvsClient
from tests.services.gateway.envs_stack import EnvsStack, envs_stack, sse_end

__all__ = ["envs_stack"]

GSM = {"question": "Tom has 3 boxes of 14 pens. How many pens?", "answer": "#### 42"}
RIGHT = (
    "def has_close_elements(numbers, threshold):\n"
    "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
    "               for b in numbers[i + 1:])\n"
)


@dataclass
class Episode:
    env: str
    create: dict[str, Any]  # /create's body, env_name aside
    tool: tuple[str, dict[str, Any], str]  # a tool call and text its answer holds
    submit: dict[str, Any]


EPISODES = [
    Episode("math", {"task_spec": GSM}, ("submit", {"answer": "<answer>41</answer>"}, ""), {}),
    Episode(
        "calculator",
        {"task_spec": GSM},
        ("calculate", {"expression": "3 * 14"}, "42"),
        {"answer": "<answer>42</answer>"},
    ),
    Episode(
        "python",
        {"task_spec": GSM},
        ("run", {"code": "pens = 3 * 14\nprint('pens', pens)"}, "pens 42"),
        {"answer": "<answer>42</answer>"},
    ),
    Episode(
        "code",
        {"split": "test", "index": 0},  # HumanEval/0, has_close_elements
        ("run_tests", {"code": "def has_close_elements(n, t):\n    return False\n"}, "passed 1"),
        {"code": RIGHT},
    ),
]
# math's one tool is submit, which finishes the episode: it submits once, a wrong answer (0.0);
# the others use their tool, then submit the right answer (1.0).
REWARD = {"math": 0.0, "calculator": 1.0, "python": 1.0, "code": 1.0}


def curl(*args: str) -> str:
    run = subprocess.run(
        ["curl", "-sS", "--fail-with-body", *args], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
@pytest.mark.parametrize("ep", EPISODES, ids=lambda e: e.env)
def test_curl_runs_a_whole_episode(envs_stack: EnvsStack, ep: Episode) -> None:
    ors = f"{envs_stack.gateway}/ors"
    key = ("-H", f"Authorization: Bearer {envs_stack.keys.keys['alpha']}")
    created = curl("-X", "POST", *key, f"{ors}/create_session")
    sid = created.split("event: task_id")[1].split("data: ")[1].split()[0]
    session = ("-H", f"X-Session-ID: {sid}", "-H", "Content-Type: application/json")
    curl(*key, *session, "-d", json.dumps({"env_name": ep.env, **ep.create}), f"{ors}/create")
    assert json.loads(curl(*key, *session, f"{ors}/{ep.env}/prompt"))[0]["text"]
    name, args, shows = ep.tool
    out = sse_end(curl(*key, *session, "-d", json.dumps({"name": name, "input": args}),
                       f"{ors}/{ep.env}/call"))  # fmt: skip
    assert out["ok"] and shows in out["output"]["blocks"][0]["text"], out
    if ep.submit:
        submit = {"name": "submit", "input": ep.submit}
        out = sse_end(curl(*key, *session, "-d", json.dumps(submit), f"{ors}/{ep.env}/call"))
    assert out["output"]["reward"] == REWARD[ep.env] and out["output"]["finished"] is True
    curl("-X", "POST", *key, *session, f"{ors}/delete")


@pytest.mark.parametrize("ep", EPISODES, ids=lambda e: e.env)
def test_arbiter_envs_runs_a_whole_episode(envs_stack: EnvsStack, ep: Episode) -> None:
    key = envs_stack.keys.keys["beta"]
    with EnvsClient(envs_stack.gateway, api_key=key, timeout=120) as envs:
        spec = ep.create.get("task_spec")
        where = {} if spec else {"split": ep.create["split"], "index": ep.create["index"]}
        with envs.session(ep.env, spec, **where) as episode:
            assert episode.prompt()[0].text
            name, args, shows = ep.tool
            out = episode.call(name, **args)
            assert shows in out.blocks[0].text
            if ep.submit:
                out = episode.call("submit", **ep.submit)
    assert out.reward == REWARD[ep.env] and out.finished
    assert out.metadata is not None and "components" in out.metadata
