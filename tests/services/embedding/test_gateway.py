"""diversity end to end: gateway (recipe gsm8k-diverse) → verify + embedding, real processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import start_service


@pytest.fixture(scope="module")
def diverse_gateway_url(
    log_dir: Path, verify_url: str, embedding_url: str, redis_url: str
) -> Iterator[str]:
    env = {
        "GATEWAY_VERIFY_URL": verify_url,
        "GATEWAY_EMBEDDING_URL": embedding_url,
        "REDIS_URL": redis_url,
    }
    proc, url = start_service("gateway", log_dir, env)
    yield url
    proc.stop()


def group(gsm8k_dir: Path, line: int, gid: str) -> dict[str, Any]:
    item = json.loads((gsm8k_dir / "test.jsonl").read_text().splitlines()[line])
    ans = item["answer"].split("####")[-1].strip().replace(",", "")
    steps = item["answer"].split("####")[0].strip()
    responses = [
        f"<think>{steps}</think><answer>{ans}</answer>",  # right, formatted
        f"<think>{steps}</think><answer>{ans}</answer>",  # the same text again
        f"The answer is {ans}.",  # right, no tags
        f"<think>I am not sure, maybe {ans}1?</think><answer>{ans}1</answer>",  # wrong
        f"<think>Let me think step by step.\n{steps}</think>\n<answer>{ans}</answer>",
    ]
    return {"id": gid, "prompt": item["question"], "reference": item["answer"],
            "responses": responses}  # fmt: skip


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}{path}", json=body, timeout=120.0)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_gsm8k_diverse_combines_math_format_and_diversity(
    diverse_gateway_url: str, embedding_url: str, gsm8k_dir: Path
) -> None:
    groups = [group(gsm8k_dir, 200, "a"), group(gsm8k_dir, 201, "b")]
    out = post(diverse_gateway_url, "/v1/score", {"recipe": "gsm8k-diverse", "groups": groups})
    weights = {c["name"]: c["weight"] for c in out["recipe"]["components"]}
    assert weights == {"math_accuracy": 1.0, "format": 0.5, "diversity": 0.3}
    direct = post(embedding_url, "/v1/diversity", {"groups": groups, "params": {}})
    for got, want in zip(out["groups"], direct["groups"], strict=True):
        comps = got["components"]
        np.testing.assert_allclose(comps["diversity"], want["scores"], atol=1e-6)
        assert comps["math_accuracy"] == [1.0, 1.0, 1.0, 0.0, 1.0]
        assert comps["format"] == [1.0, 1.0, 0.0, 1.0, 1.0]
        expected = [
            1.0 * m + 0.5 * f + 0.3 * d
            for m, f, d in zip(
                comps["math_accuracy"], comps["format"], comps["diversity"], strict=True
            )
        ]
        np.testing.assert_allclose(got["rewards"], expected, atol=1e-9)
        assert got["masked"] == [False] * 5 and got["errors"] == []
        assert comps["diversity"][0] == pytest.approx(comps["diversity"][1])  # same text

    # the same request again: diversity comes from the cache, whole groups at a time
    again = post(diverse_gateway_url, "/v1/score", {"recipe": "gsm8k-diverse", "groups": groups})
    assert again["usage"]["cache_hits"] == again["usage"]["responses"] * 3
    for first, second in zip(out["groups"], again["groups"], strict=True):
        assert second["components"]["diversity"] == first["components"]["diversity"]


def test_a_changed_response_changes_the_whole_groups_diversity(
    diverse_gateway_url: str, gsm8k_dir: Path
) -> None:
    base = group(gsm8k_dir, 210, "c")
    first = post(diverse_gateway_url, "/v1/score", {"recipe": "gsm8k-diverse", "groups": [base]})
    changed = {**base, "responses": [*base["responses"][:-1], "Something else entirely."]}
    second = post(
        diverse_gateway_url, "/v1/score", {"recipe": "gsm8k-diverse", "groups": [changed]}
    )
    d1 = first["groups"][0]["components"]["diversity"]
    d2 = second["groups"][0]["components"]["diversity"]
    # the group-level cache key covers every response: no stale score for the unchanged ones
    assert all(abs(a - b) > 1e-6 for a, b in zip(d1[:-1], d2[:-1], strict=True))


def test_empty_and_lone_responses_are_masked_not_zero(
    diverse_gateway_url: str, gsm8k_dir: Path
) -> None:
    g = group(gsm8k_dir, 220, "d")
    empty = {**g, "id": "empty", "responses": [*g["responses"][:3], "   "]}
    lone = {**g, "id": "lone", "responses": g["responses"][:1]}
    out = post(
        diverse_gateway_url, "/v1/score", {"recipe": "gsm8k-diverse", "groups": [empty, lone]}
    )
    e, one = out["groups"]
    assert e["components"]["diversity"][3] is None and e["masked"] == [False, False, False, True]
    assert {(x["component"], x["index"], x["kind"]) for x in e["errors"]} == {
        ("diversity", 3, "empty_response")
    }
    assert one["rewards"] == [None] and one["masked"] == [True]
    assert [(x["component"], x["kind"]) for x in one["errors"]] == [
        ("diversity", "group_too_small")
    ]
