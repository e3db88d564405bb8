"""The usage ledger and the cache scope, on a real gateway with verify, a judge service in
front of the judge stub (it reports token usage like any OpenAI server), and real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import ManagedProcess, free_port, uvicorn_process
from tests.conftest import start_service
from tests.services.gateway.teams import Keys, groups, post, start_gateway, team_total, usage

SHARED_RECIPES = """
recipes:
  - name: gsm8k-shared
    cache: shared
    components: [{name: math_accuracy, weight: 1.0}, {name: format, weight: 0.5}]
"""


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("usage") / "keys.yaml")
    k.add("u1", "u1")
    k.add("u2", "u2")
    k.add("jt", "jt", judge_tokens_per_day=50)  # less than one judged request uses
    k.add("admin", "ops", admin=True)
    return k


@pytest.fixture(scope="module")
def judge_url(log_dir: Path) -> Iterator[str]:
    port = free_port()
    stub = uvicorn_process(
        "judge-stub", "tests.services.judge.stub:create_app", port,
        log_path=log_dir / f"judge-stub-{port}.log", ready_path="/health",
    )  # fmt: skip
    stub.start()
    procs: list[ManagedProcess] = [stub]
    try:
        stub.wait_ready(30)
        env = {"JUDGE_BASE_URL": f"http://127.0.0.1:{port}/v1", "JUDGE_MODEL": "no_logprobs"}
        judge, url = start_service("judge", log_dir, env)
        procs.append(judge)
        yield url
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture(scope="module")
def gateway(
    log_dir: Path,
    verify_url: str,
    redis_url: str,
    judge_url: str,
    keys: Keys,
    tmp_path_factory: Any,
) -> Iterator[str]:
    recipes = tmp_path_factory.mktemp("recipes") / "recipes.yaml"
    recipes.write_text(SHARED_RECIPES)
    env = {
        "GATEWAY_JUDGE_URL": judge_url,
        "GATEWAY_RECIPES_FILE": str(recipes),
        # configured, nothing listens: diversity is null with kind unavailable (a fault)
        "GATEWAY_EMBEDDING_URL": f"http://127.0.0.1:{free_port()}",
    }
    proc, url = start_gateway(log_dir, verify_url, redis_url, keys, **env)
    yield url
    proc.stop()


def _score(url: str, keys: Keys, label: str, recipe: str, gs: list[Any]) -> dict[str, Any]:
    r = post(url, {"recipe": recipe, "groups": gs}, keys.headers(label))
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_usage_counts_equal_what_was_sent(gateway: str, keys: Keys) -> None:
    first = groups(2, 3)
    bodies = [
        _score(gateway, keys, "u1", "gsm8k", first),  # 6 responses, all new
        _score(gateway, keys, "u1", "gsm8k", groups(1, 4)),  # 4 more
        _score(gateway, keys, "u1", "gsm8k", first),  # the first again: 12 cache hits
        _score(gateway, keys, "u1", "gsm8k-diverse", groups(1, 2)),  # the embedding is down
    ]
    day = usage(gateway, keys.headers("u1"))["days"]
    assert [d["team"] for d in day] == ["u1"]
    got = day[0]
    assert got["requests"] == 4
    assert got["responses"] == 6 + 4 + 6 + 2 == sum(b["usage"]["responses"] for b in bodies)
    assert got["cache_hits"] == 12 == sum(b["usage"]["cache_hits"] for b in bodies)
    assert got["cache_misses"] == sum(b["usage"]["cache_misses"] for b in bodies)
    assert got["components"]["math_accuracy"] == {"responses": 18, "cache_hits": 6}
    assert got["components"]["diversity"] == {"responses": 2, "cache_hits": 0}
    assert got["errors"] == {"unavailable": 2}  # diversity, null with kind unavailable
    assert got["judge_prompt_tokens"] == 0


def test_judge_tokens_are_charged_as_the_judge_reported(gateway: str, keys: Keys) -> None:
    body = _score(gateway, keys, "jt", "gsm8k-dj", groups(2, 2))
    assert body["groups"][0]["components"]["judge_quality"] == [0.75, 0.75]  # the stub's 4/5
    reported = body["usage"]
    assert reported["judge_prompt_tokens"] > 0 and reported["judge_completion_tokens"] > 0
    got = usage(gateway, keys.headers("jt"))["days"][0]
    assert got["judge_prompt_tokens"] == reported["judge_prompt_tokens"]
    assert got["judge_completion_tokens"] == reported["judge_completion_tokens"]
    # 50 tokens a day: that request overdrew the bucket; judged requests now wait for it,
    # requests without the judge go on.
    r = post(gateway, {"recipe": "gsm8k-dj", "groups": groups(1, 1)}, keys.headers("jt"))
    assert r.status_code == 429, r.text
    assert "judge_tokens_per_day" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) > 60
    assert post(gateway, {"recipe": "gsm8k", "groups": groups(1, 1)}, keys.headers("jt")).is_success


def test_cached_scores_stay_in_their_team_unless_the_recipe_is_shared(
    gateway: str, keys: Keys
) -> None:
    same = groups(2, 3)
    assert _score(gateway, keys, "u1", "gsm8k", same)["usage"]["cache_hits"] == 0
    assert _score(gateway, keys, "u2", "gsm8k", same)["usage"]["cache_hits"] == 0  # not u1's
    assert _score(gateway, keys, "u1", "gsm8k", same)["usage"]["cache_hits"] == 12  # its own
    shared = groups(2, 3)
    a = _score(gateway, keys, "u1", "gsm8k-shared", shared)
    b = _score(gateway, keys, "u2", "gsm8k-shared", shared)
    assert a["usage"]["cache_hits"] == 0 and b["usage"]["cache_hits"] == 12
    assert a["groups"][0]["components"] == b["groups"][0]["components"]
    # the scope is not part of the fingerprint: the same reward function as gsm8k
    assert (
        b["recipe"]["fingerprint"]
        == _score(gateway, keys, "u2", "gsm8k", shared)["recipe"]["fingerprint"]
    )
    assert b["recipe"]["cache"] == "shared"


def test_usage_range_and_admin_view(gateway: str, keys: Keys) -> None:
    _score(gateway, keys, "u2", "gsm8k", groups(1, 1))
    today = datetime.now(UTC).date()
    week = {"from": str(today - timedelta(days=6)), "to": str(today)}
    every = usage(gateway, keys.headers("admin"), **week)
    assert {"u1", "u2", "jt"} <= {d["team"] for d in every["days"]}
    assert team_total(every, "u2", "requests") >= 1
    assert usage(gateway, keys.headers("u2"), **week)["days"][0]["team"] == "u2"
    before = {"from": str(today - timedelta(days=9)), "to": str(today - timedelta(days=8))}
    assert usage(gateway, keys.headers("u2"), **before)["days"] == []
    h = keys.headers("u2")
    for params, param in [
        ({"from": str(today), "to": str(today - timedelta(days=1))}, "to"),  # backwards
        ({"from": "2020-01-01", "to": "2026-01-01"}, "to"),  # more than 366 days
        ({"from": "yesterday"}, "from"),  # not a date
    ]:
        r = httpx.get(f"{gateway}/v1/usage", params=params, headers=h)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == param


def test_compat_samples_of_two_teams_are_never_one_group(gateway: str, keys: Keys) -> None:
    # Both teams send a sample of the same prompt at once, asking for groups of 2: were
    # the team not part of the group key, the two would be scored as one group, billed to
    # one team.
    prompt = f"compat {uuid.uuid4().hex}: 1+1?"
    sample = {"prompt": prompt, "response": "<answer>2</answer>", "label": "2"}
    path = "/v1/compat/slime/gsm8k?group_size=2&window_ms=1000"

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return list(
                await asyncio.gather(
                    *(
                        client.post(f"{gateway}{path}", json=sample, headers=keys.headers(t))
                        for t in ("u1", "u2")
                    )
                )
            )

    before = {t: team_total(usage(gateway, keys.headers(t)), t, "responses") for t in ("u1", "u2")}
    for r in asyncio.run(both()):
        assert r.status_code == 200, r.text
    for team in ("u1", "u2"):
        got = team_total(usage(gateway, keys.headers(team)), team, "responses")
        assert got - before[team] == 1, team  # its own group of one, its own ledger
