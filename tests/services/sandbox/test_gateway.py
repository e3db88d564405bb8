"""The sandbox behind a real gateway: recipes, the cache, usage per team, 422s, fairness.

A real ``arbiter serve gateway`` with keys for three teams, the session's verify service,
Redis and the session's sandbox service (2 workers, 6 s per response).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.services.scoring.recipes import RecipeBook
from tests.services.gateway.conftest import EXPECTED_MATH, gsm8k_groups
from tests.services.gateway.teams import Keys, post, start_gateway, team_total, usage
from tests.services.sandbox.conftest import ENV, Sandbox, group, problems
from tests.services.sandbox.test_containment import CORPUS

ITEM_DEADLINE_S = float(ENV["SANDBOX_ITEM_TIMEOUT_S"])


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    k = Keys(tmp_path_factory.mktemp("sandbox-gw") / "keys.yaml")
    k.add("coders", "coders")
    k.add("math", "math")
    k.add("other", "other")
    return k


@pytest.fixture(scope="module")
def gateway(
    log_dir: Path, verify_url: str, redis_url: str, keys: Keys, sandbox: Sandbox
) -> Iterator[str]:
    proc, url = start_gateway(log_dir, verify_url, redis_url, keys, GATEWAY_SANDBOX_URL=sandbox.url)
    yield url
    proc.stop()


def code_groups(n: int, tag: str) -> list[dict[str, Any]]:
    rows = problems()[:n]
    return [
        group(r["reference"], r["correct"], r["wrong"], prompt=f"{tag} {r['prompt']}", gid=r["id"])
        for r in rows
    ]


def test_the_code_recipe_end_to_end_with_the_cache_and_usage(gateway: str, keys: Keys) -> None:
    tag = f"t{time.monotonic_ns()}"  # new prompts: nothing cached yet
    groups = code_groups(6, tag)
    body = {"recipe": "code", "groups": groups}
    r = post(gateway, body, keys.headers("coders"))
    assert r.status_code == 200, r.text
    out = r.json()
    for row, g in zip(problems()[:6], out["groups"], strict=True):
        want = [1.0, row["wrong_passes"] / row["tests"]]
        assert g["components"]["code_tests"] == pytest.approx(want), g
        assert g["rewards"] == pytest.approx(want) and g["errors"] == []
        assert g["info"]["code_tests"]["tests"] == [row["tests"]] * 2  # the breakdown
    assert out["usage"]["sandbox_cpu_ms"] > 0 and out["usage"]["cache_hits"] == 0
    # the same request again: every score from the cache, no program run, no CPU charged
    again = post(gateway, body, keys.headers("coders")).json()
    assert again["usage"]["cache_hits"] == 12 and again["usage"]["sandbox_cpu_ms"] == 0
    assert [g["rewards"] for g in again["groups"]] == [g["rewards"] for g in out["groups"]]
    # a cached score keeps its reasons: the same breakdown, failed tests and why
    assert [g["info"] for g in again["groups"]] == [g["info"] for g in out["groups"]]
    # other tests for the same program are another cache entry: the key covers the tests
    changed = [{**g, "reference": g["reference"].replace("==", "!=", 1)} for g in groups[:1]]
    third = post(gateway, {"recipe": "code", "groups": changed}, keys.headers("coders")).json()
    assert third["usage"]["cache_hits"] == 0 and third["usage"]["sandbox_cpu_ms"] > 0
    # the ledger has the team's CPU time
    report = usage(gateway, keys.headers("coders"))
    assert team_total(report, "coders", "sandbox_cpu_ms") >= out["usage"]["sandbox_cpu_ms"]


def test_a_python_grader_recipe_scores_through_the_gateway(gateway: str, keys: Keys) -> None:
    source = (
        "def grade(sample, item):\n    return float(item['reference'] in sample['output_text'])\n"
    )
    recipe = {
        "components": [{"name": "python_grader", "weight": 2.0, "params": {"source": source}}]
    }
    g = group("42", "it is 42", "it is 41", prompt=f"p{time.monotonic_ns()}")
    r = post(gateway, {"recipe": recipe, "groups": [g]}, keys.headers("coders"))
    assert r.status_code == 200, r.text
    assert r.json()["groups"][0]["rewards"] == [2.0, 0.0]


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("def grade(sample, item):\n    return (\n", "does not compile"),  # a syntax error
        ("def score(sample, item):\n    return 1.0\n", "grade"),  # no grade() to call
    ],
)
def test_a_grader_that_does_not_compile_is_422_naming_the_source(
    gateway: str, keys: Keys, source: str, words: str
) -> None:
    recipe = {
        "components": [
            {"name": "code_tests", "weight": 1.0},
            {"name": "python_grader", "weight": 1.0, "params": {"source": source}},
        ]
    }
    r = post(gateway, {"recipe": recipe, "groups": [group("1", "x")]}, keys.headers("coders"))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == "recipe.components.1.params.source", error
    assert error["code"] == "invalid_params" and words in error["message"], error


def test_a_recipes_file_with_a_bad_grader_fails_at_load(tmp_path: Path) -> None:
    path = tmp_path / "recipes.yaml"
    path.write_text(
        "recipes:\n  - name: graded\n    components:\n      - name: python_grader\n"
        "        params: {source: 'def grade(:'}\n"
    )
    with pytest.raises(ValueError, match=re.escape("recipes[0].components.0.params.source")):
        RecipeBook(path)


def test_other_teams_are_answered_within_one_item_deadline_while_the_corpus_runs(
    gateway: str, keys: Keys, gsm8k_dir: Path, sandbox: Sandbox
) -> None:
    """Team coders sends the slow half of the hostile corpus, four times over (more than the
    two workers can run in a dozen seconds); meanwhile team math's gsm8k request and team
    other's one code response are each answered within one response's deadline."""
    slow = [c for c in CORPUS if "timeout" in " ".join(c[4].values())]
    tag = f"h{time.monotonic_ns()}"
    corpus_groups = [
        # four different texts (a group's identical texts are scored once)
        group(
            c[2], *[f"```python\n{c[1]}# {k}\n```" for k in range(4)], prompt=f"{tag} {i}", gid=c[0]
        )
        for i, c in enumerate(slow)
    ]
    before = _jobs_done(sandbox)
    answers: dict[str, httpx.Response] = {}

    def send_corpus() -> None:
        answers["corpus"] = httpx.post(
            f"{gateway}/v1/score",
            json={"recipe": "code", "groups": corpus_groups},
            headers=keys.headers("coders"),
            timeout=300,
        )

    sender = threading.Thread(target=send_corpus)
    sender.start()
    try:
        _wait_for(lambda: _jobs_done(sandbox) > before)  # the corpus is running
        start = time.monotonic()
        math = post(
            gateway, {"recipe": "gsm8k", "groups": gsm8k_groups(gsm8k_dir, 4)}, keys.headers("math")
        )
        math_s = time.monotonic() - start
        start = time.monotonic()
        honest = problems("assert")[0]
        code = post(
            gateway,
            {
                "recipe": "code",
                "groups": [group(honest["reference"], honest["correct"], prompt=tag)],
            },
            keys.headers("other"),
        )
        code_s = time.monotonic() - start
        assert "corpus" not in answers  # all of it happened while the corpus ran
    finally:
        sender.join(300)
    assert math.status_code == 200 and math_s < ITEM_DEADLINE_S, (math_s, math.text)
    assert [g["components"]["math_accuracy"] for g in math.json()["groups"]] == [EXPECTED_MATH] * 4
    # one job per team ahead at most: the running ones finish within their deadline
    assert code.status_code == 200 and code_s < ITEM_DEADLINE_S + 1.0, (code_s, code.text)
    assert code.json()["groups"][0]["rewards"] == [1.0]
    corpus = answers["corpus"]
    assert corpus.status_code == 200, corpus.text
    for case, g in zip(slow, corpus.json()["groups"], strict=True):
        assert g["rewards"] == pytest.approx([case[3]] * 4), (case[0], g)


def _jobs_done(sandbox: Sandbox) -> float:
    text = httpx.get(f"{sandbox.url}/metrics", timeout=5).text
    found = re.search(r"^sandbox_job_seconds_count (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)
