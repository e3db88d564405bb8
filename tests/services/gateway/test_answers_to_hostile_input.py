"""A deployment shared by many teams, hostile input: every request gets an answer, whatever
it holds; team names cannot reach another kind of Redis key; the ledger survives a restart
of Redis; what a caller sends is not echoed whole; no internal URL reaches a caller.

Real processes: the session's gateway (auth off) for the compat shapes, gateways with
keys on a Redis of their own where one is restarted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import ManagedProcess, free_port, redis_process
from arbiter.stack import _plan
from tests.conftest import start_redis
from tests.services.gateway.teams import (
    Keys,
    groups,
    post,
    start_gateway,
    team_total,
    usage,
    wait_for,
)

BIG = "x" * 150_000  # past the contract's 100,000 characters per text
PROMPT = "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"

# (route, body, the status it must get, the field a 422 names): each compat shape with an
# oversize, malformed or hostile field. Once, the oversize ones got no answer.
NEMO = "nemo-gym/gsm8k/verify"
OUTPUT_BIG = {"output": [{"content": [{"type": "output_text", "text": BIG}]}]}
CASES: list[tuple[str, Any, int, str | None]] = [
    # OpenRLHF: a long reasoning trace (the response cut out of the query is oversize)
    ("openrlhf/gsm8k", {"query": [PROMPT + BIG], "prompts": [PROMPT]}, 422, "query.0"),
    # OpenRLHF: a list label whose JSON text is oversize
    ("openrlhf/gsm8k", {"query": [PROMPT], "prompts": [PROMPT], "labels": [[BIG]]}, 422,
     "labels.0"),
    # OpenRLHF: lists of different lengths; a query that does not start with its prompt
    ("openrlhf/gsm8k", {"query": ["a", "b"], "prompts": ["a"]}, 422, "prompts"),
    ("openrlhf/gsm8k", {"query": ["zzz"], "prompts": ["abc"]}, 422, "query.0"),
    # OpenRLHF: whitespace and markers by the ten thousand (a regex rescanned them)
    ("openrlhf/gsm8k", {"query": [PROMPT + " " * 99_000 + "x"], "prompts": [PROMPT]}, 200, None),
    ("openrlhf/gsm8k", {"query": [PROMPT + "4" + "</s> " * 19_000], "prompts": [PROMPT]}, 200,
     None),
    # slime: an oversize label, prompt message and response
    ("slime/gsm8k", {"prompt": "p", "response": "4", "label": BIG}, 422, "label"),
    ("slime/gsm8k", {"prompt": [{"role": "user", "content": BIG}], "response": "4"}, 422,
     "prompt"),
    ("slime/gsm8k", {"prompt": "p", "response": BIG}, 422, "response"),
    # slime: messages of the wrong shapes read as no text; a number label is a reference
    ("slime/gsm8k", {"prompt": [{"role": 5, "content": {"a": 1}}], "response": "4", "label": 4},
     200, None),
    ("slime/gsm8k", {"prompt": "p", "response": 4}, 422, "response"),
    ("slime/gsm8k", [1, 2, 3], 422, None),  # not an object at all: no field to name
    # NeMo Gym: an oversize expected_answer and response; outputs of the wrong types
    (NEMO, {"responses_create_params": {}, "response": {}, "expected_answer": BIG}, 422,
     "expected_answer"),
    (NEMO, {"responses_create_params": {}, "response": OUTPUT_BIG}, 422, "response.output"),
    (NEMO, {"responses_create_params": {"input": 5}, "response": {"output": 7},
            "expected_answer": "4"}, 200, None),
    (NEMO, {"responses_create_params": [], "response": {}}, 422, "responses_create_params"),
    # an unknown recipe, on a route
    ("slime/no-such-recipe", {"prompt": "p", "response": "4"}, 422, "recipe"),
]  # fmt: skip


async def _keep_scoring(url: str, stop: asyncio.Event, seen: list[int]) -> None:
    body = {"recipe": "gsm8k", "groups": groups(1, 2)}
    async with httpx.AsyncClient(timeout=60) as client:
        while not stop.is_set():
            seen.append((await client.post(f"{url}/v1/score", json=body)).status_code)


async def test_every_compat_shape_gets_an_answer(gateway_url: str) -> None:
    stop = asyncio.Event()
    seen: list[int] = []
    background = asyncio.create_task(_keep_scoring(gateway_url, stop, seen))
    answers = []
    async with httpx.AsyncClient(timeout=30) as client:  # an answer, in its deadline
        for route, body, _, _ in CASES:
            r = await client.post(f"{gateway_url}/v1/compat/{route}?null_reward=0", json=body)
            answers.append(r)
    stop.set()
    await background
    for (route, _, want, param), r in zip(CASES, answers, strict=True):
        assert r.status_code == want, (route, r.text[:300])
        if want != 200:
            assert r.json()["error"]["param"] == param, (route, r.text[:300])
            assert len(r.content) < 4000  # nothing echoed whole
    assert seen and set(seen) == {200}, seen  # the background client kept being served


def test_a_huge_recipe_name_is_not_echoed(gateway_url: str) -> None:
    body = {"recipe": "r" * 1_000_000, "groups": groups(1, 1)}
    r = httpx.post(f"{gateway_url}/v1/score", json=body, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_recipe"
    assert len(r.content) < 2000


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("hostile") / "keys.yaml")
    k.add("teams", "teams")  # the name the per-day set of teams had once
    k.add("other", "other")
    k.add("small", "small", responses_per_minute=4)
    k.add("admin", "ops", admin=True)
    return k


@pytest.fixture(scope="module")
def gateway(log_dir: Path, verify_url: str, redis_url: str, keys: Keys) -> Iterator[str]:
    dead = f"http://127.0.0.1:{free_port()}"
    proc, url = start_gateway(
        log_dir,
        verify_url,
        redis_url,
        keys,
        GATEWAY_EMBEDDING_URL=dead,
        GATEWAY_KEYS_RELOAD_S="0.1",
    )
    yield url
    proc.stop()


def test_a_team_named_teams_breaks_no_ones_usage(gateway: str, keys: Keys) -> None:
    # Finding 6: the team's ledger key was the per-day set of teams: its own usage and the
    # admin's all-teams usage were 500s (showing the Redis command and key).
    for label in ("teams", "other"):
        r = post(gateway, {"recipe": "gsm8k", "groups": groups(1, 2)}, keys.headers(label))
        assert r.status_code == 200, r.text
    own = usage(gateway, keys.headers("teams"))
    assert team_total(own, "teams", "responses") == 2
    everyone = usage(gateway, keys.headers("admin"))
    assert team_total(everyone, "teams", "responses") == 2
    assert team_total(everyone, "other", "responses") >= 2


def test_a_replay_rechecks_access_to_the_recipe(gateway: str, keys: Keys) -> None:
    # Finding 8: an Idempotency-Key replay was served after the team lost the recipe.
    body = {"recipe": "gsm8k", "groups": groups(1, 2)}
    h = keys.headers("other", **{"Idempotency-Key": "replay-after-revoke"})
    assert post(gateway, body, h).status_code == 200
    replay = post(gateway, body, h)
    assert replay.status_code == 200 and replay.headers["idempotent-replayed"] == "true"
    keys.set_team("other", recipes=["gsm8k-diverse"])
    try:
        assert wait_for(lambda: post(gateway, body, h).status_code == 403)
    finally:
        keys.set_team("other")


def test_the_compat_413_names_a_field_that_exists(gateway: str, keys: Keys) -> None:
    body = {"query": ["a1"] * 5, "prompts": ["a"] * 5}  # 5 samples, a quota of 4
    r = post(gateway, body, keys.headers("small"), path="/v1/compat/openrlhf/gsm8k")
    assert r.status_code == 413 and r.json()["error"]["param"] == "query", r.text


def test_no_internal_url_reaches_a_caller(gateway: str, keys: Keys) -> None:
    ready = httpx.get(f"{gateway}/readyz", timeout=10)
    assert "embedding" in ready.json()["checks"]
    assert "unreachable" in ready.json()["checks"]["embedding"]  # which, not where
    body = {"recipe": "gsm8k-diverse", "groups": groups(1, 2)}
    r = post(gateway, body, keys.headers("other"))
    assert r.status_code == 200
    for text in (ready.text, r.text):
        assert "http://" not in text and "127.0.0.1" not in text, text


def _kill(proc: ManagedProcess) -> None:
    assert proc.proc is not None
    os.killpg(proc.proc.pid, signal.SIGKILL)  # no shutdown: nothing is saved on the way out
    proc.proc.wait(10)


def test_the_ledger_survives_a_restart_of_redis(
    log_dir: Path, tmp_path: Path, verify_url: str, keys: Keys
) -> None:
    # Finding 8: `arbiter up` ran Redis with --save "" (nothing kept): a restart wiped the
    # usage ledger. It now runs it with an append-only file, as compose and k8s do.
    args = argparse.Namespace(
        redis_port=free_port(),
        no_embedding=True,
        no_sandbox=True,
        judge_base_url=None,
        judge_model=None,
        verify_port=None,
        embedding_port=None,
        judge_port=None,
        sandbox_port=None,
        gateway_port=None,
    )
    argv = " ".join(_plan(args, tmp_path / "stack")[0].argv)
    assert "--appendonly yes --appendfsync everysec" in argv
    port = free_port()
    redis = redis_process(port, log_path=log_dir / f"redis-{port}.log", data_dir=tmp_path)
    redis.start().wait_ready(10)
    url = f"redis://127.0.0.1:{port}/0"
    proc, gateway = start_gateway(log_dir, verify_url, url, keys)
    try:
        r = post(gateway, {"recipe": "gsm8k", "groups": groups(3, 2)}, keys.headers("other"))
        assert r.status_code == 200, r.text
        before = usage(gateway, keys.headers("other"))
        assert team_total(before, "other", "responses") == 6
        _kill(redis)
        redis.start().wait_ready(10)
        after = wait_for(lambda: _usage_or_none(gateway, keys.headers("other")), timeout=20)
        assert after == before
    finally:
        proc.stop()
        redis.stop()


def _usage_or_none(url: str, headers: dict[str, str]) -> dict[str, Any] | None:
    r = httpx.get(f"{url}/v1/usage", headers=headers, timeout=10)
    return r.json() if r.status_code == 200 else None


def test_a_redis_error_reading_usage_names_no_command(
    log_dir: Path, verify_url: str, keys: Keys
) -> None:
    redis, url = start_redis(log_dir)
    proc, gateway = start_gateway(log_dir, verify_url, url, keys)
    try:
        _kill(redis)
        r = httpx.get(f"{gateway}/v1/usage", headers=keys.headers("admin"), timeout=30)
        assert r.status_code == 503, r.text
        assert "HGETALL" not in r.text and "SMEMBERS" not in r.text and "arb:" not in r.text
    finally:
        proc.stop()
        redis.stop()
