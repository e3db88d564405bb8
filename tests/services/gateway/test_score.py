"""POST /v1/score end to end: real gateway, real verify, real Redis (session fixtures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import free_port, service_process
from arbiter.proto.gateway import ScoreResponse
from arbiter.services.scoring.recipes import RecipeBook
from tests.conftest import start_service
from tests.services.gateway.conftest import EXPECTED_FORMAT, EXPECTED_MATH, gsm8k_groups, score


async def test_named_recipe_scores_and_combines(gateway_url: str, gsm8k_dir: Path) -> None:
    groups = gsm8k_groups(gsm8k_dir, 2, offset=100)
    r = await score(gateway_url, {"recipe": "gsm8k", "groups": groups})
    assert r.status_code == 200, r.text
    ScoreResponse.model_validate_json(r.content)  # rendered from plain lists, in the model's shape
    body = r.json()
    assert body["recipe"]["name"] == "gsm8k"
    assert body["recipe"]["fingerprint"] == RecipeBook().get("gsm8k").ref.fingerprint
    for got, sent in zip(body["groups"], groups, strict=True):
        assert got["id"] == sent["id"]
        assert got["components"] == {"math_accuracy": EXPECTED_MATH, "format": EXPECTED_FORMAT}
        expected = zip(EXPECTED_MATH, EXPECTED_FORMAT, strict=True)
        assert got["rewards"] == [m + 0.5 * f for m, f in expected]
        assert got["masked"] == [False] * 6 and got["errors"] == []
        # verify's per-group info comes through (here: the extracted answers)
        assert "math_accuracy" in got["info"]
    usage = body["usage"]
    assert usage["responses"] == 12
    assert usage["cache_hits"] + usage["cache_misses"] == 24
    assert usage["elapsed_ms"] > 0


async def test_cache_hits_are_counted(gateway_url: str, gsm8k_dir: Path) -> None:
    groups = gsm8k_groups(gsm8k_dir, 1, offset=110)
    first = (await score(gateway_url, {"recipe": "gsm8k", "groups": groups})).json()
    again = (await score(gateway_url, {"recipe": "gsm8k", "groups": groups})).json()
    assert first["usage"]["cache_hits"] == 0
    assert again["usage"]["cache_hits"] == 12 and again["usage"]["cache_misses"] == 0
    assert [{**g, "info": {}} for g in again["groups"]] == [
        {**g, "info": {}} for g in first["groups"]
    ]
    # the reasons survive the cache: each response's extracted answer comes back with it
    answers = [
        g["info"]["math_accuracy"]["answers"] for g in (first["groups"][0], again["groups"][0])
    ]
    # (the first answer lists what verify was sent, duplicates once; the cached one every response)
    assert len(answers[1]) == len(groups[0]["responses"]) and set(answers[1]) == set(answers[0])


async def test_inline_recipe_with_params(gateway_url: str, gsm8k_dir: Path) -> None:
    groups = gsm8k_groups(gsm8k_dir, 1, offset=120)
    inline = {"components": [{"name": "format", "weight": 2.0, "params": {"mode": "strict"}}]}
    body = (await score(gateway_url, {"recipe": inline, "groups": groups})).json()
    assert body["recipe"]["name"] == "inline"
    assert body["recipe"]["components"] == inline["components"]
    assert body["groups"][0]["rewards"] == [2.0 * f for f in EXPECTED_FORMAT]
    same = {"components": [{"name": "math_accuracy"}, {"name": "format", "weight": 0.5}]}
    named = (await score(gateway_url, {"recipe": same, "groups": groups})).json()
    assert named["recipe"]["fingerprint"] == RecipeBook().get("gsm8k").ref.fingerprint


GOOD_GROUP = {"id": "g", "prompt": "1+1?", "reference": "2", "responses": ["<answer>2</answer>"]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"recipe": "gsm9k", "groups": [GOOD_GROUP]}, "recipe"),  # unknown recipe
        ({"recipe": {"components": [{"name": "maths"}]}, "groups": [GOOD_GROUP]},
         "recipe.components.0.name"),  # unknown component
        ({"recipe": {"components": [{"name": "format", "weight": "heavy"}]},
          "groups": [GOOD_GROUP]}, "recipe.components.0.weight"),  # wrong type, inline
        ({"recipe": {"components": [{"name": "format", "params": {"mode": 3}}]},
          "groups": [GOOD_GROUP]}, "recipe.components.0.params.mode"),  # bad param
        # a judge param typo: checked against proto.judge.QualityParams at the gateway, so
        # it is refused even though no judge service is configured here
        ({"recipe": {"components": [{"name": "format"},
                                    {"name": "judge_quality", "params": {"rubricc": "x"}}]},
          "groups": [GOOD_GROUP]}, "recipe.components.1.params.rubricc"),
        # a diversity param typo (proto.embedding.DiversityParams), no embedding service either
        ({"recipe": {"components": [{"name": "diversity", "params": {"normalise": "none"}}]},
          "groups": [GOOD_GROUP]}, "recipe.components.0.params.normalise"),
        ({"recipe": 7, "groups": [GOOD_GROUP]}, "recipe"),  # neither name nor object
        ({"recipe": "gsm8k", "groups": [{**GOOD_GROUP, "responses": []}]},
         "groups.0.responses"),  # empty responses
        ({"recipe": "gsm8k", "groups": [{**GOOD_GROUP, "responses": ["a", 5]}]},
         "groups.0.responses.1"),  # a response that is not a string
        ({"recipe": "gsm8k", "groups": []}, "groups"),  # no groups
        ({"recipe": "gsm8k", "groups": [GOOD_GROUP], "on_error": "ignore"}, "on_error"),
        ({"groups": [GOOD_GROUP]}, "recipe"),  # recipe missing
        ({"recipe": "gsm8k", "groups": [GOOD_GROUP], "recipes": "x"}, "recipes"),  # typo
    ],
)  # fmt: skip
async def test_bad_input_names_the_field(
    gateway_url: str, body: dict[str, Any], param: str
) -> None:
    r = await score(gateway_url, body)
    assert r.status_code in (400, 422), r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err


async def test_body_that_is_not_json(gateway_url: str) -> None:
    async with httpx.AsyncClient() as client:
        headers = {"content-type": "application/json"}
        r = await client.post(f"{gateway_url}/v1/score", content=b"{nope", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


async def test_recipes_endpoint(gateway_url: str) -> None:
    async with httpx.AsyncClient() as client:
        body = (await client.get(f"{gateway_url}/v1/recipes")).json()
    by_name = {r["name"]: r for r in body["recipes"]}
    assert {"gsm8k", "gsm8k-diverse", "gsm8k-dj", "gsm8k-verifier"} <= set(by_name)
    assert by_name["gsm8k"]["fingerprint"] == RecipeBook().get("gsm8k").ref.fingerprint


async def test_ops_endpoints(gateway_url: str) -> None:
    async with httpx.AsyncClient() as client:
        ready = await client.get(f"{gateway_url}/readyz")
        metrics = (await client.get(f"{gateway_url}/metrics")).text
        docs = await client.get(f"{gateway_url}/docs")
        health = await client.get(f"{gateway_url}/healthz")
    # embedding, judge and sandbox are not configured here: each reported, readiness passes
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert checks["verify"] == "ok" and checks["cache"] == "ok"
    assert checks["judge"].startswith("not configured") and "GATEWAY_JUDGE_URL" in checks["judge"]
    assert "GATEWAY_SANDBOX_URL" in checks["sandbox"], checks
    for name in (
        "arbiter_gateway_score_requests_total",
        "arbiter_gateway_component_seconds",
        "arbiter_gateway_cache_total",
        "arbiter_gateway_redis_errors_total",
        "arbiter_gateway_component_errors_total",
    ):
        assert name in metrics
    assert docs.status_code == 200 and health.status_code == 200


async def test_yaml_recipes_file(log_dir: Path, verify_url: str, tmp_path: Path) -> None:
    path = tmp_path / "recipes.yaml"
    path.write_text(
        "recipes:\n"
        "  - name: format-partial\n"
        "    components:\n"
        "      - {name: format, weight: 1.0, params: {mode: partial}}\n"
    )
    proc, url = start_service(
        "gateway", log_dir, {"GATEWAY_VERIFY_URL": verify_url, "GATEWAY_RECIPES_FILE": str(path)}
    )
    try:
        async with httpx.AsyncClient() as client:
            names = [r["name"] for r in (await client.get(f"{url}/v1/recipes")).json()["recipes"]]
        assert "format-partial" in names and "gsm8k" in names
        group = {"id": "p", "responses": ["<think>a</think><answer>1</answer>", "no tags at all"]}
        body = (await score(url, {"recipe": "format-partial", "groups": [group]})).json()
        assert body["recipe"]["name"] == "format-partial"
        partial = body["groups"][0]["components"]["format"]
        assert partial[0] == 1.0 and partial[1] is not None and partial[1] < 1.0
    finally:
        proc.stop()


def test_bad_recipes_file_stops_the_start(log_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"recipes": [{"name": "x", "components": [{"name": "nope"}]}]}))
    proc = service_process(
        "gateway", free_port(), env={"GATEWAY_RECIPES_FILE": str(path)},
        log_path=log_dir / "gateway-bad-recipes.log",
    )  # fmt: skip
    proc.start()
    with pytest.raises(RuntimeError, match="exited early"):
        proc.wait_ready(30)
    proc.stop()
    assert "unknown component 'nope'" in (log_dir / "gateway-bad-recipes.log").read_text()


async def test_unconfigured_component(gateway_url: str) -> None:
    # The session gateway has no GATEWAY_JUDGE_URL: gsm8k-dj is refused before any work,
    # in both on_error modes, with a 422 that says how to add the judge
    # (tests/services/gateway/test_not_configured.py covers every entry point).
    body = {"recipe": "gsm8k-dj", "groups": [GOOD_GROUP]}
    for mode in ("mask", "fail"):
        r = await score(gateway_url, {**body, "on_error": mode})
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "component_not_configured" and err["param"] == "recipe"
        assert "judge_quality" in err["message"] and "GATEWAY_JUDGE_URL" in err["message"]


async def test_partial_hits_and_duplicates_keep_info_aligned(gateway_url: str) -> None:
    a, b = "<think>x</think><answer>41</answer>", "<think>y</think><answer>42</answer>"
    c, d = "The answer is 42.", "<answer>7</answer>"  # the prompt makes the keys unique
    base = {"id": "info", "prompt": "info-test: 6*7?", "reference": "42"}
    primed = await score(
        gateway_url, {"recipe": "gsm8k", "groups": [{**base, "responses": [a, b]}]}
    )
    assert primed.status_code == 200
    full = {"recipe": "gsm8k", "groups": [{**base, "responses": [a, b, c, d, c]}]}
    body = (await score(gateway_url, full)).json()
    group = body["groups"][0]
    assert group["components"]["math_accuracy"] == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert group["components"]["format"] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert body["usage"]["cache_hits"] == 4  # a and b, for both components
    # verify saw only [c, d] (c once); a's and b's notes came from the cache with their
    # scores: the info lists every response's, in the group's order
    info = group["info"]["math_accuracy"]
    assert "sent_indices" not in info and len(info["answers"]) == 5, info
    assert info["answers"][0] == primed.json()["groups"][0]["info"]["math_accuracy"]["answers"][0]
    assert info["answers"][2] == info["answers"][4]  # c, scored once, at both its places
    # with no cached notes, a de-duplicated group maps its positions via sent_indices
    fresh = {**base, "prompt": "info-test 2: 6*7?", "responses": [c, d, c]}
    body = (await score(gateway_url, {"recipe": "gsm8k", "groups": [fresh]})).json()
    info = body["groups"][0]["info"]["math_accuracy"]
    assert info["sent_indices"] == [0, 1] and len(info["answers"]) == 2, info
