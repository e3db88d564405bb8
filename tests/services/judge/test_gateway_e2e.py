"""End to end: gateway → verify + judge → real vLLM, with the built-in judge recipes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_service

GROUPS = [
    {
        "id": "q-clips",
        "prompt": "Natalia sold clips to 48 of her friends in April, and then she sold half "
        "as many clips in May. How many clips did Natalia sell altogether in April and May?",
        "reference": "Natalia sold 48/2 = 24 clips in May.\n#### 72",
        "responses": [
            "<think>48 / 2 = 24, 48 + 24 = 72</think><answer>72</answer>",  # right, formatted
            "<think>48 + 48 = 96</think><answer>96</answer>",  # wrong, formatted
            "The answer is 72.",  # right, no tags
        ],
    },
    {
        "id": "q-weng",
        "prompt": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes "
        "of babysitting. How much did she earn?",
        "reference": "#### 10",
        "responses": ["<think>12 * 50 / 60 = 10</think><answer>10</answer>", "$10"],
    },
]
WEIGHTS = {
    "gsm8k-dj": {"math_accuracy": 1.0, "format": 0.5, "judge_quality": 0.3},
    "gsm8k-verifier": {"judge_verifier": 1.0, "format": 0.2},
}


@pytest.fixture(scope="module")
def judge_gateway(log_dir: Path, verify_url: str, judge_url: str) -> Iterator[str]:
    """A gateway of its own (in-process cache) so the first calls really reach the judge."""
    env = {"GATEWAY_VERIFY_URL": verify_url, "GATEWAY_JUDGE_URL": judge_url}
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()


async def _score(url: str, recipe: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=180) as http:
        r = await http.post(f"{url}/v1/score", json={"recipe": recipe, "groups": GROUPS})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.mark.parametrize("recipe", ["gsm8k-dj", "gsm8k-verifier"])
async def test_judge_recipes_through_gateway(judge_gateway: str, recipe: str) -> None:
    body = await _score(judge_gateway, recipe)
    weights = WEIGHTS[recipe]
    async with httpx.AsyncClient(timeout=30) as http:
        listed = (await http.get(f"{judge_gateway}/v1/recipes")).json()["recipes"]
    ref = next(r for r in listed if r["name"] == recipe)
    assert body["recipe"]["name"] == recipe
    assert body["recipe"]["fingerprint"] == ref["fingerprint"]
    assert body["recipe"]["fingerprint"].startswith("sha256:")
    assert {c["name"]: c["weight"] for c in body["recipe"]["components"]} == weights

    assert [g["id"] for g in body["groups"]] == [g["id"] for g in GROUPS]
    for group, sent in zip(body["groups"], GROUPS, strict=True):
        n = len(sent["responses"])
        assert set(group["components"]) == set(weights)
        assert all(len(v) == n for v in group["components"].values())
        assert group["errors"] == [], group["errors"]  # judge answers every item
        for j in range(n):
            parts = {name: group["components"][name][j] for name in weights}
            assert all(v is not None and 0.0 <= v <= 1.0 for v in parts.values())
            expected = sum(weights[name] * v for name, v in parts.items())
            assert group["rewards"][j] == pytest.approx(expected)
            assert group["masked"][j] is False
    judge_name = next(name for name in weights if name.startswith("judge_"))
    assert body["groups"][0]["components"]["format"] == [1.0, 1.0, 0.0]
    assert judge_name in body["groups"][0]["info"]

    usage = body["usage"]
    assert usage["responses"] == 5
    assert usage["judge_prompt_tokens"] > 5 * 100
    assert usage["judge_completion_tokens"] >= 5  # verifier: 1 token each; quality: JSON

    again = await _score(judge_gateway, recipe)  # cached now: same scores, no judge tokens
    assert [g["rewards"] for g in again["groups"]] == [g["rewards"] for g in body["groups"]]
    assert again["usage"]["cache_hits"] > 0
    assert again["recipe"]["fingerprint"] == body["recipe"]["fingerprint"]
