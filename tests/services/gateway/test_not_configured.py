"""A recipe that needs a component this deployment has not configured is refused before any
work (422 ``component_not_configured``, never retried), on ``/v1/score`` and on every
compat route; ``GET /v1/recipes`` says which recipes are available and why not. A
component that is configured but down stays a fault: null with a retryable kind.

Real gateway processes: the session ``gateway_url`` has verify only (no judge, no
embedding); ``judge_down_url`` has both configured at ports where nothing listens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import free_port
from tests.conftest import start_service
from tests.services.gateway.teams import Keys, groups, running_gateway, usage

JUDGE_RECIPES = ("gsm8k-dj", "gsm8k-verifier")
NEEDS = {"gsm8k-dj": "judge_quality", "gsm8k-verifier": "judge_verifier"}
QUESTION, GOOD = "What is 17 + 1?", "<think>17 + 1</think><answer>18</answer>"
GROUP = {
    "id": "q",
    "prompt": QUESTION,
    "reference": "18",
    "responses": [GOOD, "<answer>19</answer>"],
}


def assert_refused(r: httpx.Response, component: str, service: str = "judge") -> str:
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error", err
    assert err["code"] == "component_not_configured" and err["param"] == "recipe", err
    message: str = err["message"]
    assert component in message and f"GATEWAY_{service.upper()}_URL" in message, message
    if service == "judge":  # the fix for each way of running
        assert "COMPOSE_PROFILES=cpu or gpu" in message
        assert "GATEWAY_JUDGE_URL=http://judge:8003" in message
        assert "arbiter up: --judge-base-url URL --judge-model NAME" in message
    assert "http://127.0.0.1" not in message  # what is missing, never where anything is
    return message


def post(url: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(url, json=body, timeout=30, **kw)


@pytest.mark.parametrize("recipe", JUDGE_RECIPES)
@pytest.mark.parametrize("on_error", ["mask", "fail"])
def test_score_refuses_a_judge_recipe_without_a_judge(
    gateway_url: str, recipe: str, on_error: str
) -> None:
    body = {"recipe": recipe, "groups": [GROUP], "on_error": on_error}
    message = assert_refused(post(f"{gateway_url}/v1/score", body), NEEDS[recipe])
    assert message.startswith(f"recipe {recipe!r} needs the judge service")


def test_score_refuses_diversity_without_an_embedding_service(gateway_url: str) -> None:
    r = post(f"{gateway_url}/v1/score", {"recipe": "gsm8k-diverse", "groups": [GROUP]})
    message = assert_refused(r, "diversity", "embedding")
    assert "--no-embedding" in message


def test_an_inline_recipe_is_refused_the_same_way(gateway_url: str) -> None:
    recipe = {"components": [{"name": "format"}, {"name": "judge_verifier"}]}
    r = post(f"{gateway_url}/v1/score", {"recipe": recipe, "groups": [GROUP]})
    assert assert_refused(r, "judge_verifier").startswith("recipe (inline) needs")
    # params are checked first: a typo is named even when the service is missing too
    bad = {"components": [{"name": "judge_quality", "params": {"rubricc": "x"}}]}
    r = post(f"{gateway_url}/v1/score", {"recipe": bad, "groups": [GROUP]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_params"


def compat_calls(base: str, recipe: str) -> list[tuple[str, dict[str, Any]]]:
    question, response = QUESTION, GOOD
    nemo = {
        "responses_create_params": {"input": [{"role": "user", "content": question}]},
        "response": {
            "id": "r",
            "created_at": 0,
            "model": "m",
            "object": "response",
            "output": [
                {
                    "id": "o",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": response, "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        },
        "expected_answer": "18",
    }
    return [
        (
            f"{base}/v1/compat/openrlhf/{recipe}",
            {"query": [question + response], "prompts": [question], "labels": ["18"]},
        ),
        (
            f"{base}/v1/compat/slime/{recipe}",
            {"prompt": question, "response": response, "label": "18"},
        ),
        (f"{base}/v1/compat/nemo-gym/{recipe}/verify", nemo),
    ]


@pytest.mark.parametrize("recipe", JUDGE_RECIPES)
def test_every_compat_route_refuses_it(gateway_url: str, recipe: str) -> None:
    for url, body in compat_calls(gateway_url, recipe):
        # even with a fill value for nulls: a deployment's choice is not a null
        for query in ("", "?null_reward=0"):
            assert_refused(post(url + query, body), NEEDS[recipe])
    # the same bodies score with a recipe the gateway has
    for url, body in compat_calls(gateway_url, "gsm8k"):
        assert post(url, body).status_code == 200, url


def test_configured_but_down_stays_a_retryable_null(judge_down_url: str) -> None:
    for recipe, component in [*NEEDS.items(), ("gsm8k-diverse", "diversity")]:
        r = post(f"{judge_down_url}/v1/score", {"recipe": recipe, "groups": [GROUP]})
        assert r.status_code == 200, r.text
        group = r.json()["groups"][0]
        assert group["components"][component] == [None, None] and group["masked"] == [True] * 2
        assert {e["kind"] for e in group["errors"]} == {"unavailable"}  # retryable
        assert all(component in e["message"] for e in group["errors"])
        assert group["components"]["format"] == [1.0, 0.0]  # the rest still scores
        # on_error=fail: a fault fails the request retryably (503), not as a refusal
        r = post(
            f"{judge_down_url}/v1/score",
            {"recipe": recipe, "groups": [GROUP], "on_error": "fail"},
        )
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable", r.text
    listed = httpx.get(f"{judge_down_url}/v1/recipes", timeout=10).json()
    assert all(r["available"] for r in listed["recipes"]) and listed["unconfigured"] == {}


def test_recipes_say_which_are_available_and_why(gateway_url: str) -> None:
    listed = httpx.get(f"{gateway_url}/v1/recipes", timeout=10).json()
    by_name = {r["name"]: r for r in listed["recipes"]}
    assert by_name["gsm8k"]["available"] is True and by_name["gsm8k"]["reason"] is None
    for recipe, component in [*NEEDS.items(), ("gsm8k-diverse", "diversity")]:
        assert by_name[recipe]["available"] is False
        # the reason is the refusal's message, word for word
        r = post(f"{gateway_url}/v1/score", {"recipe": recipe, "groups": [GROUP]})
        assert by_name[recipe]["reason"] == r.json()["error"]["message"]
        assert component in by_name[recipe]["reason"]
    assert set(listed["unconfigured"]) == {
        "diversity",
        "judge_quality",
        "judge_verifier",
        "code_tests",
        "python_grader",
    }
    assert "GATEWAY_JUDGE_URL" in listed["unconfigured"]["judge_quality"]


@pytest.fixture
def override_url(log_dir: Path, verify_url: str) -> Iterator[str]:
    """judge_verifier served by its own URL (GATEWAY_COMPONENT_URLS), no judge service."""
    overrides = {"judge_verifier": f"http://127.0.0.1:{free_port()}"}
    env = {"GATEWAY_VERIFY_URL": verify_url, "GATEWAY_COMPONENT_URLS": json.dumps(overrides)}
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()


def test_a_component_url_override_counts_as_configured(override_url: str) -> None:
    by_name = {
        r["name"]: r for r in httpx.get(f"{override_url}/v1/recipes", timeout=10).json()["recipes"]
    }
    assert by_name["gsm8k-verifier"]["available"] is True
    assert by_name["gsm8k-dj"]["available"] is False
    r = post(f"{override_url}/v1/score", {"recipe": "gsm8k-verifier", "groups": [GROUP]})
    assert r.status_code == 200  # configured (down): a null, not a refusal
    assert_refused(post(f"{override_url}/v1/score", {"recipe": "gsm8k-dj", "groups": [GROUP]}),
                   "judge_quality")  # fmt: skip


@pytest.fixture
def teams(log_dir: Path, verify_url: str, redis_url: str, tmp_path: Path) -> Iterator[Any]:
    keys = Keys(tmp_path / "keys.yaml")
    keys.add("t", "refused", responses_per_minute=4)
    keys.add("no-dj", "no-dj", recipes=["gsm8k"])
    with running_gateway(log_dir, verify_url, redis_url, keys) as url:
        yield url, keys


def test_a_refusal_costs_no_quota_and_no_idempotency_key(teams: tuple[str, Keys]) -> None:
    url, keys = teams
    body = {"recipe": "gsm8k-dj", "groups": groups(1, 4)}
    h = keys.headers("t", **{"Idempotency-Key": "refused-once"})
    for _ in range(3):  # over the quota three times, were it charged
        assert_refused(post(f"{url}/v1/score", body, headers=h), "judge_quality")
    # the key was never claimed, the quota never taken: the same key scores gsm8k
    ok = post(f"{url}/v1/score", {**body, "recipe": "gsm8k"}, headers=h)
    assert ok.status_code == 200, ok.text
    day = usage(url, keys.headers("t"))["days"][0]
    assert day["requests"] == 1 and day["responses"] == 4
    # a team that may not use the recipe is told so first (403), not how to add a judge
    r = post(f"{url}/v1/score", body, headers=keys.headers("no-dj"))
    assert r.status_code == 403 and r.json()["error"]["code"] == "recipe_not_allowed"
    listed = httpx.get(f"{url}/v1/recipes", headers=keys.headers("no-dj"), timeout=10).json()
    assert [r["name"] for r in listed["recipes"]] == ["gsm8k"]
