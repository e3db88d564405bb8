"""The environments' quota and usage ledger through the gateway's ``/ors``.

Real stack (``envs_stack``). Each test uses a team of its own (a fresh name), so the
buckets and ledger rows it reads are its own whatever ran before on the session's Redis.
Guarded: a team past its tool calls per minute is refused with 429, ``Retry-After`` and
``quota_exceeded`` before the envs service runs anything; the sandbox CPU a tool call used
(the envs service's ``X-Arbiter-Usage``) is charged, so a team past its CPU per minute is
refused too; opening an episode (``/create``, which holds its task in the state Redis)
takes a call, and one refused (422) gives it back; what was run is in ``/v1/usage``
(``env_tool_calls``, ``sandbox_cpu_ms``, ``rate_limited``); another team is not held by
the first team's quota.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from arbiter.envs import EnvsClient
from arbiter.errors import RateLimited
from arbiter.retry import NO_RETRY
from tests.services.gateway.envs_stack import EnvsStack, envs_stack, first_task
from tests.services.gateway.teams import team_total, usage, wait_for

__all__ = ["envs_stack"]


def fresh_team(stack: EnvsStack) -> tuple[str, str]:
    """(label, team) of a new key of a new team."""
    team = f"q-{uuid.uuid4().hex[:8]}"
    stack.keys.add(team, team)
    return team, team


def test_tool_calls_per_minute_refuse_with_retry_after(envs_stack: EnvsStack) -> None:
    label, team = fresh_team(envs_stack)
    other, _ = fresh_team(envs_stack)
    # 3 a minute: the episode opened (/create takes one) and two tool calls
    with envs_stack.gateway_with(GATEWAY_ENVS_TOOL_CALLS_PER_MINUTE="3") as url:
        task = first_task(envs_stack, "calculator")
        key = envs_stack.keys.keys[label]
        envs = EnvsClient(url, api_key=key, retry=NO_RETRY)
        with envs, envs.session("calculator", task) as episode:
            episode.call("calculate", expression="1 + 1")
            episode.call("calculate", expression="2 + 2")
            with pytest.raises(RateLimited) as refused:
                episode.call("calculate", expression="3 + 3")
        assert refused.value.code == "quota_exceeded"
        assert "tool_calls_per_minute" in refused.value.message
        # the answer itself: 429 in the envelope with Retry-After (about 20 s for 1 of 3/min)
        headers = envs_stack.keys.headers(label)
        r = httpx.post(f"{url}/ors/create_session", headers=headers, timeout=30)
        sid = r.text.split("data: ")[1].split()[0]
        body = {"env_name": "calculator", "task_spec": task}
        r = httpx.post(
            f"{url}/ors/create", json=body, headers={**headers, "X-Session-ID": sid}, timeout=30
        )
        # opening an episode takes a call too (it holds its task in the state Redis)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "quota_exceeded"
        r = httpx.post(
            f"{url}/ors/calculator/call",
            json={"name": "calculate", "input": {"expression": "1"}},
            headers={**headers, "X-Session-ID": sid},
            timeout=30,
        )
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "quota_exceeded"
        assert 1 <= int(r.headers["Retry-After"]) <= 21
        # another team has its own bucket
        envs = EnvsClient(url, api_key=envs_stack.keys.keys[other], retry=NO_RETRY)
        with envs, envs.session("calculator", task) as episode:
            assert "2" in episode.call("calculate", expression="1 + 1").blocks[0].text
        admin = envs_stack.keys.headers("admin")
        report = wait_for(lambda: usage(url, admin, team=team))
        assert team_total(report, team, "env_tool_calls") == 2
        assert team_total(report, team, "rate_limited") == 3


def test_opening_episodes_is_held_to_the_quota(envs_stack: EnvsStack) -> None:
    label, _ = fresh_team(envs_stack)
    with envs_stack.gateway_with(GATEWAY_ENVS_TOOL_CALLS_PER_MINUTE="2") as url:
        headers = envs_stack.keys.headers(label)
        task = first_task(envs_stack, "calculator")

        def create(spec: dict[str, object]) -> httpx.Response:
            sid = str(uuid.uuid4())
            body = {"env_name": "calculator", "task_spec": spec}
            h = {**headers, "X-Session-ID": sid}
            return httpx.post(f"{url}/ors/create", json=body, headers=h, timeout=30)

        for _ in range(3):  # refused by the envs service: each gives its call back
            r = create({"question": "no answer"})
            assert r.status_code == 422, r.text
        assert [create(task).status_code for _ in range(2)] == [200, 200]
        r = create(task)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "quota_exceeded"
        assert "tool_calls_per_minute" in r.json()["error"]["message"]


def test_sandbox_cpu_is_charged_and_recorded(envs_stack: EnvsStack) -> None:
    label, team = fresh_team(envs_stack)
    # 1 ms of sandbox CPU per minute: one run() uses more, so the next tool call waits
    with envs_stack.gateway_with(GATEWAY_ENVS_SANDBOX_CPU_S_PER_MINUTE="0.001") as url:
        task = first_task(envs_stack, "python")
        key = envs_stack.keys.keys[label]
        envs = EnvsClient(url, api_key=key, retry=NO_RETRY)
        with envs, envs.session("python", task) as episode:
            out = episode.call("run", code="print(sum(i * i for i in range(200000)))")
            assert "2666646666700000" in out.blocks[0].text
            with pytest.raises(RateLimited) as refused:
                episode.call("run", code="print(1)")
        assert "sandbox_cpu_s_per_minute" in refused.value.message
        admin = envs_stack.keys.headers("admin")

        def charged() -> dict[str, object] | None:
            report = usage(url, admin, team=team)
            return report if team_total(report, team, "sandbox_cpu_ms") > 0 else None

        report = wait_for(charged)
        assert report is not None, "the run's sandbox CPU was not recorded"
        assert team_total(report, team, "env_tool_calls") == 1
