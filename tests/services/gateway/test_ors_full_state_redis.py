"""A tool call with an ``Idempotency-Key`` while the state Redis refuses writes (full, at
its ``maxmemory``: ``noeviction``), on a stack of its own, real Redis.

Guarded: the call is refused (503 ``idempotency_unavailable``) before it runs, instead of
running without its key's guarantee; once Redis takes writes again, the retry with the same
key scores once, and a further retry is answered from the stored answer: the submit is
scored, and counted, once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import start_redis
from tests.services.gateway.envs_stack import EnvsStack, running_envs_stack, sse_end
from tests.services.gateway.teams import team_total, usage, wait_for

TASK = {"question": "6 * 7?", "answer": "42"}


@pytest.fixture(scope="module")
def stack(
    log_dir: Path, verify_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EnvsStack, redis.Redis]]:
    proc, url = start_redis(log_dir)
    redis.Redis.from_url(url).config_set("maxmemory-policy", "noeviction")  # a state Redis
    keys = tmp_path_factory.mktemp("full-keys") / "keys.yaml"
    try:
        with running_envs_stack(log_dir, verify_url, url, keys) as s:
            yield s, redis.Redis.from_url(url)
    finally:
        proc.stop()


def test_a_keyed_call_is_not_run_while_redis_refuses_writes(
    stack: tuple[EnvsStack, redis.Redis],
) -> None:
    s, r = stack
    key = s.keys.headers("alpha")
    created = httpx.post(f"{s.gateway}/create_session", headers=key, timeout=30)
    sid = created.text.split("data: ")[1].split()[0]
    headers = {**key, "X-Session-ID": sid}
    body = {"env_name": "calculator", "task_spec": TASK}
    assert httpx.post(f"{s.gateway}/create", json=body, headers=headers).status_code == 200
    submit = {"name": "submit", "input": {"answer": "42"}}
    keyed = {**headers, "Idempotency-Key": "submit-1"}

    def send() -> httpx.Response:
        return httpx.post(f"{s.gateway}/calculator/call", json=submit, headers=keyed, timeout=60)

    r.config_set("maxmemory", int(r.info("memory")["used_memory"]))  # full from here on
    try:
        refused = send()
    finally:
        r.config_set("maxmemory", 0)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "idempotency_unavailable"
    first = send()
    assert first.status_code == 200 and sse_end(first.text)["output"]["reward"] == 1.0
    again = send()
    assert again.headers.get("Idempotent-Replayed") == "true" and again.content == first.content
    admin = s.keys.headers("admin")
    report = wait_for(
        lambda: (
            (u := usage(s.gateway, admin, team="alpha"))
            and (team_total(u, "alpha", "env_tool_calls") >= 1 and u)
        )
    )
    assert report and team_total(report, "alpha", "env_tool_calls") == 1, report
