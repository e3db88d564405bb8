"""Episodes through the gateway's ``/ors`` with API keys, driven by ``arbiter.envs``.

The stack is real (``envs_stack``): keyed gateway, envs service, verify, sandbox, Redis.
What is guarded: a whole episode's reward comes back through the gateway, from the same
components as ``/v1/score``; a session belongs to its key's team (another team's key gets
404 for it); discovery needs no key and everything else does; the envs service down is a
retryable 503 in the one envelope, never a reward.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from arbiter.envs import AsyncEnvsClient, EnvsClient, ToolRefused
from arbiter.errors import ArbiterError, NotFound
from arbiter.retry import NO_RETRY
from tests.services.gateway.envs_stack import EnvsStack, envs_stack, first_task

__all__ = ["envs_stack"]  # the fixture, imported for pytest


def client(stack: EnvsStack, label: str) -> EnvsClient:
    return EnvsClient(stack.gateway, api_key=stack.keys.keys[label], timeout=60)


def final_answer(task: dict[str, Any]) -> str:
    return str(task["answer"]).split("####")[-1].strip().replace(",", "")


def test_math_episode_is_scored_like_v1_score(envs_stack: EnvsStack) -> None:
    task = first_task(envs_stack, "math")
    answer = final_answer(task)
    with client(envs_stack, "alpha") as envs:
        assert {"math", "calculator", "python", "code"} <= set(envs.environments())
        assert [t.name for t in envs.tools("math")] == ["submit"]
        with envs.session("math", task) as episode:
            assert task["question"] in episode.prompt()[0].text
            out = episode.call("submit", answer=f"<think>sum</think><answer>{answer}</answer>")
    # the gsm8k recipe: math_accuracy 1.0 + format 0.5, as /v1/score gives it
    assert out.finished and out.reward == 1.5
    assert out.metadata is not None and "components" in out.metadata


def test_calculator_episode_with_a_tool_then_a_wrong_answer(envs_stack: EnvsStack) -> None:
    task = first_task(envs_stack, "calculator")
    with client(envs_stack, "alpha") as envs, envs.session("calculator", task) as episode:
        out = episode.call("calculate", expression="6 * 7")
        assert not out.finished and out.reward is None
        assert "42" in out.blocks[0].text
        out = episode.call("submit", answer=str(int(final_answer(task)) + 1))
        assert out.finished and out.reward == 0.0  # a wrong answer: a measured 0
        with pytest.raises(ToolRefused) as refused:  # the episode is over
            episode.call("submit", answer="1")
        assert refused.value.code == "episode_finished"


def test_async_client_runs_episodes_concurrently(envs_stack: EnvsStack) -> None:
    tasks = [first_task(envs_stack, "math")]

    async def run(envs: AsyncEnvsClient, wrong: int) -> float | None:
        answer = int(final_answer(tasks[0])) + wrong
        async with envs.session("math", tasks[0]) as episode:
            out = await episode.call("submit", answer=f"<answer>{answer}</answer>")
        return out.reward

    async def main() -> list[float | None]:
        key = envs_stack.keys.keys["beta"]
        async with AsyncEnvsClient(envs_stack.gateway, api_key=key, timeout=60) as envs:
            return list(await asyncio.gather(*(run(envs, w) for w in (0, 1, 0, 2))))

    # right answers without <think>: math 1.0 + format 0; wrong ones 0
    assert asyncio.run(main()) == [1.0, 0.0, 1.0, 0.0]


def test_another_teams_session_is_not_found(envs_stack: EnvsStack) -> None:
    task = first_task(envs_stack, "math")
    with client(envs_stack, "alpha") as alpha, alpha.session("math", task) as episode:
        # beta's key, naming alpha's team in the internal header: the key decides the team
        beta_headers = envs_stack.keys.headers(
            "beta", **{"X-Session-ID": episode.sid, "X-Arbiter-Team": "alpha"}
        )
        r = httpx.get(f"{envs_stack.gateway}/ors/math/prompt", headers=beta_headers, timeout=30)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "session_not_found", r.text
        body = {"name": "submit", "input": {"answer": "1"}}
        r = httpx.post(
            f"{envs_stack.gateway}/ors/math/call", json=body, headers=beta_headers, timeout=30
        )
        assert r.status_code == 404, r.text
        assert episode.prompt()  # still alpha's, untouched


def test_discovery_is_open_and_sessions_need_a_key(envs_stack: EnvsStack) -> None:
    url = f"{envs_stack.gateway}/ors"
    assert httpx.get(f"{url}/list_environments", timeout=30).status_code == 200
    assert httpx.get(f"{url}/math/tools", timeout=30).status_code == 200
    # the task routes take a body: a key, but no team (the openreward SDK's too)
    split = {"split": "test"}
    r = httpx.post(f"{url}/math/tasks", json=split, timeout=30)
    assert r.status_code == 401, r.text
    key = envs_stack.keys.headers("alpha")
    r = httpx.post(f"{url}/math/num_tasks", json=split, headers=key, timeout=30)
    assert r.status_code == 200 and r.json()["num_tasks"] > 0
    r = httpx.post(f"{url}/math/task", json={**split, "index": 0}, headers=key, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/create_session", timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = httpx.post(f"{url}/create_session", headers={"X-API-Key": "nope"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    # the key as ORS clients send it
    r = httpx.post(
        f"{url}/create_session", headers={"X-API-Key": envs_stack.keys.keys["alpha"]}, timeout=30
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "X-Arbiter-Usage" not in r.headers  # internal, never relayed


def test_a_bad_task_spec_is_refused_naming_the_field(envs_stack: EnvsStack) -> None:
    with client(envs_stack, "alpha") as envs, pytest.raises(ArbiterError) as refused:
        envs.session("math", {"question": "2 + 2?"})  # no answer
    assert refused.value.status == 422
    assert refused.value.param == "task_spec.answer"


def test_envs_down_is_a_retryable_503(envs_stack: EnvsStack) -> None:
    with envs_stack.gateway_with(GATEWAY_ENVS_URL="http://127.0.0.1:9") as url:
        envs = EnvsClient(url, api_key=envs_stack.keys.keys["alpha"], retry=NO_RETRY)
        with envs, pytest.raises(ArbiterError) as down:
            envs.session("math", {"question": "1 + 1?", "answer": "2"})
        assert down.value.status == 503 and down.value.retryable
        assert down.value.code == "envs_unavailable"
        assert "127.0.0.1:9" not in down.value.message  # never where


def test_unknown_session_is_404(envs_stack: EnvsStack) -> None:
    with client(envs_stack, "alpha") as envs:
        headers = envs_stack.keys.headers("alpha", **{"X-Session-ID": "no-such-session"})
        r = httpx.get(f"{envs_stack.gateway}/ors/math/prompt", headers=headers, timeout=30)
        assert r.status_code == 404
        with pytest.raises(NotFound):
            envs.tools("no-such-env")
