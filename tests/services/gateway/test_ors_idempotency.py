"""``Idempotency-Key`` on the gateway's ``/ors`` POSTs, against the real envs service.

Guarded: a tool call retried with its key is answered from the first answer (the same SSE
bytes and content type, ``Idempotent-Replayed: true``) and is not run again, so an episode
does not advance twice and the ledger counts it once; a key reused with another body is
422 naming the header; keys are per team.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.services.gateway.envs_stack import EnvsStack, envs_stack, first_task, sse_end
from tests.services.gateway.teams import team_total, usage, wait_for

__all__ = ["envs_stack"]


def post(
    stack: EnvsStack, path: str, label: str, body: Any = None, **headers: str
) -> httpx.Response:
    return httpx.post(
        f"{stack.gateway}/ors/{path}",
        json=body,
        headers=stack.keys.headers(label, **headers),
        timeout=60,
    )


def episode(stack: EnvsStack, label: str, env: str) -> str:
    r = post(stack, "create_session", label)
    assert r.status_code == 200, r.text
    sid = r.text.split("event: task_id")[1].split("data: ")[1].split()[0]
    r = post(
        stack,
        "create",
        label,
        {"env_name": env, "task_spec": first_task(stack, env)},
        **{"X-Session-ID": sid},
    )
    assert r.status_code == 200, r.text
    return sid


def test_a_retried_tool_call_is_answered_once(envs_stack: EnvsStack) -> None:
    team = f"i-{uuid.uuid4().hex[:8]}"
    envs_stack.keys.add(team, team)
    sid = episode(envs_stack, team, "calculator")
    key = str(uuid.uuid4())
    submit = {"name": "submit", "input": {"answer": "0"}}
    first = post(
        envs_stack, "calculator/call", team, submit, **{"X-Session-ID": sid, "Idempotency-Key": key}
    )
    assert first.status_code == 200, first.text
    assert first.headers["content-type"].startswith("text/event-stream")
    assert sse_end(first.text)["output"]["finished"] is True
    again = post(
        envs_stack, "calculator/call", team, submit, **{"X-Session-ID": sid, "Idempotency-Key": key}
    )
    assert again.status_code == 200, again.text
    assert again.content == first.content  # the stored bytes, not a second submit
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["content-type"] == first.headers["content-type"]
    # without the key the same submit is run, and the finished episode refuses it
    fresh = post(envs_stack, "calculator/call", team, submit, **{"X-Session-ID": sid})
    assert sse_end(fresh.text) == {
        "ok": False,
        "error": sse_end(fresh.text)["error"],
        "reason": "episode_finished",
    }
    # the same key with another body
    other = {"name": "submit", "input": {"answer": "1"}}
    r = post(
        envs_stack, "calculator/call", team, other, **{"X-Session-ID": sid, "Idempotency-Key": key}
    )
    assert r.status_code == 422 and r.json()["error"]["param"] == "Idempotency-Key"
    admin = envs_stack.keys.headers("admin")
    report = wait_for(lambda: usage(envs_stack.gateway, admin, team=team))
    # the submit and the refused one ran (a refusal is an answer); the replay did not
    assert team_total(report, team, "idempotent_replays") == 1
    assert team_total(report, team, "env_tool_calls") == 2


def test_create_session_replayed_gives_the_same_session(envs_stack: EnvsStack) -> None:
    key = str(uuid.uuid4())
    a = post(envs_stack, "create_session", "alpha", **{"Idempotency-Key": key})
    b = post(envs_stack, "create_session", "alpha", **{"Idempotency-Key": key})
    assert a.status_code == b.status_code == 200
    assert a.content == b.content
    # another team's same key is its own
    c = post(envs_stack, "create_session", "beta", **{"Idempotency-Key": key})
    assert c.status_code == 200 and c.content != a.content
