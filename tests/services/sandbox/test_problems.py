"""The hand-written problem set (problems/problems.jsonl) through a real sandbox service.

Thirty problems in the three shapes a reference takes: HumanEval-style (``check`` and an
entry point, here given per group as ``{"tests", "entry_point"}``), plain asserts
(MBPP-style) and stdin/stdout pairs. Each has a correct solution (every test passes) and a
wrong one whose passing tests were counted by hand (``wrong_passes`` of ``tests``).
"""

from __future__ import annotations

import pytest

from tests.services.sandbox.conftest import Sandbox, group, problems

SHAPES = ("humaneval", "assert", "stdio")


@pytest.mark.parametrize("shape", SHAPES)
def test_correct_solutions_pass_and_wrong_ones_score_their_share(
    sandbox: Sandbox, shape: str
) -> None:
    rows = problems(shape)
    assert len(rows) >= 8
    groups = [
        group(r["reference"], r["correct"], r["wrong"], prompt=r["prompt"], gid=r["id"])
        for r in rows
    ]
    body = sandbox.score("code_tests", groups)
    assert body["component"] == "code_tests"
    assert body["usage"]["items"] == 2 * len(rows)
    assert body["usage"]["cpu_ms"] > 0
    for row, g in zip(rows, body["groups"], strict=True):
        assert g["id"] == row["id"] and g["errors"] == [], g
        n = row["tests"]
        assert g["info"]["tests"] == [n, n], (row["id"], g["info"])
        assert g["scores"] == [1.0, pytest.approx(row["wrong_passes"] / n)], (row["id"], g)
        assert g["info"]["failed"][0] == {}, (row["id"], g["info"])
        assert len(g["info"]["failed"][1]) == n - row["wrong_passes"], (row["id"], g["info"])


def test_mode_all_is_all_or_nothing(sandbox: Sandbox) -> None:
    rows = [r for r in problems() if 0 < r["wrong_passes"] < r["tests"]]
    groups = [group(r["reference"], r["correct"], r["wrong"], gid=r["id"]) for r in rows]
    body = sandbox.score("code_tests", groups, {"mode": "all"})
    for row, g in zip(rows, body["groups"], strict=True):
        assert g["scores"] == [1.0, 0.0], (row["id"], g)
    # is_prime's wrong solution fails its first test: the run stops there
    (g,) = [g for g in body["groups"] if g["id"] == "he/is_prime"]
    reasons = g["info"]["failed"][1]
    assert reasons["0"].startswith("assertion failed"), reasons
    assert all(reasons[str(i)] == "not run: an earlier test failed" for i in range(1, 5)), reasons


def test_the_entry_point_comes_from_params_or_the_prompt(sandbox: Sandbox) -> None:
    tests = "def check(candidate):\n    assert candidate(2) == 4\n"
    program = "def double(x):\n    return 2 * x\n"
    # from params
    body = sandbox.score("code_tests", [group(tests, program)], {"entry_point": "double"})
    assert body["groups"][0]["scores"] == [1.0]
    # from the last function the prompt defines
    prompt = "def helper():\n    pass\n\ndef double(x):\n    '''2x'''\n"
    body = sandbox.score("code_tests", [group(tests, program, prompt=prompt)])
    assert body["groups"][0]["scores"] == [1.0]
    # a program without that function: its test fails with the NameError, not a null
    body = sandbox.score(
        "code_tests",
        [group(tests, "def triple(x):\n    return 3 * x\n")],
        {"entry_point": "double"},
    )
    g = body["groups"][0]
    assert g["scores"] == [0.0] and "NameError" in g["info"]["failed"][0]["0"], g


@pytest.mark.parametrize(
    ("reference", "words"),
    [
        ("", "holds no tests"),  # nothing to run
        ("x = 1\n", "no assert"),  # code without a single assert
        ("assert (\n", "does not parse"),  # test code that is not Python
        ("[]", "empty"),  # an empty list of pairs
        ('[{"input": "1"}]', "expected"),  # a pair without its output
        ("def check(candidate):\n    assert candidate(1)\n", "entry point"),  # no entry point
    ],
)
def test_a_reference_without_usable_tests_is_null_not_zero(
    sandbox: Sandbox, reference: str, words: str
) -> None:
    body = sandbox.score("code_tests", [group(reference, "def f():\n    return 1\n")])
    g = body["groups"][0]
    assert g["scores"] == [None], g
    assert g["errors"][0]["kind"] == "invalid_reference" and words in g["errors"][0]["message"]


def test_a_failing_response_costs_cpu_time_that_is_reported(sandbox: Sandbox) -> None:
    program = "def f():\n    n = 0\n    for i in range(3_000_000):\n        n += i\n    return n\n"
    body = sandbox.score("code_tests", [group("assert f() == 1\n", program)])
    assert body["groups"][0]["scores"] == [0.0]
    assert body["usage"]["cpu_ms"] >= 50  # three million additions take tens of ms at least
