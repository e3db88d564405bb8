"""The reference the suite sample is scored against (bench/services/suite_check.py and
suite_rows.py): what counts as a test, the share a program earns, the responses built."""

from __future__ import annotations

import ast
import signal

from bench.services import suite_check, suite_rows

PROMPT = 'def first(xs):\n    """The first item, None for an empty list."""\n'
TESTS = (
    "def check(candidate):\n"
    "    assert candidate([]) == None\n"
    "    assert candidate([3, 4]) == 3\n"
    "    assert True\n"
    "    xs = [5]\n"
    "    assert candidate(xs) == 5\n"
    "    assert 1 == 1, 'a constant'\n"
)
SOLUTION = PROMPT + "    return xs[0] if xs else None\n"


def test_asserts_that_never_call_the_candidate_are_not_tests() -> None:
    got = suite_check.per_test(SOLUTION, TESTS, "first", 2.0)
    assert got == {"results": [True, True, True], "ignored": 2, "timeouts": []}


def test_return_none_earns_only_the_tests_none_really_passes() -> None:
    nothing = suite_rows.returns_none(SOLUTION, "first")
    (fn,) = ast.parse(nothing).body
    assert isinstance(fn, ast.FunctionDef) and ast.get_docstring(fn) is not None  # kept
    got = suite_check.per_test(nothing, TESTS, "first", 2.0)
    assert got["results"] == [True, False, False]
    assert suite_rows.share(got) == 1 / 3


def test_the_suite_harness_verdict_stops_at_the_first_failure() -> None:
    assert suite_check.verdict(SOLUTION, TESTS, "first") == "passed"
    wrong = PROMPT + "    return xs[-1] if xs else None\n"
    assert suite_check.verdict(wrong, TESTS, "first").startswith("failed: AssertionError")
    # per test, the same program passes what it passes
    assert suite_check.per_test(wrong, TESTS, "first", 2.0)["results"] == [True, False, True]


def test_mbpp_style_asserts_count_when_they_call_a_function_the_program_defines() -> None:
    program = "import math\ndef area(r):\n    return math.pi * r * r\n"
    tests = "import math\nassert math.isclose(area(1), math.pi)\nassert math.pi > 3\n"
    got = suite_check.per_test(program, tests, None, 2.0)
    assert got == {"results": [True], "ignored": 1, "timeouts": []}


def test_a_program_that_does_not_load_fails_every_real_test() -> None:
    got = suite_check.per_test(PROMPT + "    return (\n", TESTS, "first", 2.0)
    assert got["results"] == [False, False, False]


def test_a_test_past_its_time_fails_as_a_timeout() -> None:
    before = signal.signal(signal.SIGALRM, suite_check._alarm)  # as main() sets it
    looping = PROMPT + "    while True:\n        pass\n"
    try:
        got = suite_check.per_test(looping, TESTS, "first", 0.05)
    finally:
        signal.signal(signal.SIGALRM, before)
    assert got["results"] == [False, False, False] and got["timeouts"] == [0, 1, 2]


def test_each_mutant_changes_one_operator_constant_or_return() -> None:
    program = "def f(a, b):\n    if a < b:\n        return a + 1\n    return b\n"
    mutants = list(suite_rows.mutants(program, "f"))
    assert [m.splitlines()[1].strip() for m in mutants[:2]] == ["if a <= b:", "if a < b:"]
    assert "return a - 1" in mutants[1] and "return a + 2" in mutants[2]
    assert "return not a + 1" in mutants[3] and "return not b" in mutants[4]
    assert len(mutants) == 5


def test_the_usage_example_calls_the_entry_point_as_the_tests_do() -> None:
    assert suite_rows.example_call(TESTS, "first", check=True) == "first([])"
    response = suite_rows.with_example(SOLUTION, "first([])")
    assert response.count("```python") == 2 and response.rstrip().endswith("```")


def test_mbpp_asserts_of_a_program_that_does_not_load_count_by_the_names_they_use() -> None:
    tests = "import math\nassert math.isclose(area(1), math.pi)\nassert math.pi > 3\n"
    got = suite_check.per_test("def area(r):\n    return (\n", tests, None, 2.0)
    assert got == {"results": [False], "ignored": 1, "timeouts": []}
