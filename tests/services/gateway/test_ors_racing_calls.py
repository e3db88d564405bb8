"""Calls a team sends at once on one episode, through the gateway's ``/ors``.

Real stack (``envs_stack``), each test with a team of its own. Guarded: calls sent at once
on one episode take turns, each run and charged once (the cost the envs service reports in
its stream is taken out, never relayed), so racing calls buy no sandbox CPU past the quota;
an ``Idempotency-Key`` sent again on another episode is 422 naming the header, never that
episode answered (and rewarded) with the first one's result.
"""

from __future__ import annotations

import concurrent.futures as cf
import uuid
from typing import Any

import httpx

from tests.services.gateway.envs_stack import EnvsStack, envs_stack, first_task, sse_end
from tests.services.gateway.teams import team_total, usage, wait_for

__all__ = ["envs_stack"]

RACERS = 4


def fresh_team(stack: EnvsStack) -> str:
    """A new team with a key, once the gateway has read the keys file again."""
    team = f"r-{uuid.uuid4().hex[:8]}"
    stack.keys.add(team, team)
    known = wait_for(lambda: post(stack, "create_session", team).status_code != 401, 30)
    assert known, "the gateway did not load the new key"
    return team


def post(
    stack: EnvsStack, path: str, team: str, body: Any = None, **headers: str
) -> httpx.Response:
    return httpx.post(
        f"{stack.gateway}/ors/{path}",
        json=body,
        headers=stack.keys.headers(team, **headers),
        timeout=120,
    )


def episode(stack: EnvsStack, team: str, env: str) -> str:
    r = post(stack, "create_session", team)
    assert r.status_code == 200, r.text
    sid = r.text.split("event: task_id")[1].split("data: ")[1].split()[0]
    body = {"env_name": env, "task_spec": first_task(stack, env)}
    r = post(stack, "create", team, body, **{"X-Session-ID": sid})
    assert r.status_code == 200, r.text
    return sid


def test_calls_at_once_on_one_episode_take_turns_and_are_charged(envs_stack: EnvsStack) -> None:
    team = fresh_team(envs_stack)
    sid = episode(envs_stack, team, "python")
    run = {"name": "run", "input": {"code": "print(sum(i * i for i in range(2_000_000)))"}}
    with cf.ThreadPoolExecutor(RACERS) as pool:
        answers = list(
            pool.map(
                lambda _: post(envs_stack, "python/call", team, run, **{"X-Session-ID": sid}),
                range(RACERS),
            )
        )
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert sse_end(answer.text)["ok"] is True, answer.text
        assert "arbiter-usage" not in answer.text  # the gateway's, never relayed
    admin = envs_stack.keys.headers("admin")

    def charged() -> dict[str, object] | None:
        report = usage(envs_stack.gateway, admin, team=team)
        return report if team_total(report, team, "env_tool_calls") >= RACERS else None

    report = wait_for(charged)
    assert report is not None, "the runs were not charged"
    assert team_total(report, team, "env_tool_calls") == RACERS
    # each run used the sandbox: far more than one run's CPU is recorded
    assert team_total(report, team, "sandbox_cpu_ms") >= RACERS * 20


def test_idempotency_key_on_another_episode_is_refused(envs_stack: EnvsStack) -> None:
    team = fresh_team(envs_stack)
    first, second = episode(envs_stack, team, "calculator"), episode(envs_stack, team, "calculator")
    answer = first_task(envs_stack, "calculator")["answer"].split("####")[-1].strip()
    submit = {"name": "submit", "input": {"answer": answer}}
    key = {"Idempotency-Key": "step-1"}
    r = post(envs_stack, "calculator/call", team, submit, **key, **{"X-Session-ID": first})
    assert r.status_code == 200 and sse_end(r.text)["output"]["reward"] == 1.0, r.text
    r = post(envs_stack, "calculator/call", team, submit, **key, **{"X-Session-ID": second})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == "Idempotency-Key"
    assert r.json()["error"]["code"] == "idempotency_key_reused"
    # the second episode was not advanced: a submit of a wrong answer scores it now
    wrong = {"name": "submit", "input": {"answer": "-1"}}
    r = post(envs_stack, "calculator/call", team, wrong, **{"X-Session-ID": second})
    assert sse_end(r.text)["output"] == {**sse_end(r.text)["output"], "reward": 0.0}
    # a retry on the first episode is still its stored answer
    r = post(envs_stack, "calculator/call", team, submit, **key, **{"X-Session-ID": first})
    assert r.status_code == 200 and r.headers["Idempotent-Replayed"] == "true"
