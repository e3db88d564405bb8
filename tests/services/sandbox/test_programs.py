"""Tests from references (``programs.py``): pure functions. The program from a response:
``test_assemble.py``."""

from __future__ import annotations

import json

import pytest

from arbiter.services.sandbox.programs import ReferenceError_, parse_reference


def test_assert_statements_are_one_test_each_setup_runs_where_it_stands() -> None:
    plan = parse_reference(
        "import math\nx = 2\nassert f(x) == 4\nfor i in range(3):\n    assert f(i) == i * 2\n",
        "",
        None,
        100,
    )
    assert plan.kind == "tests" and plan.n_tests == 2
    assert "__arbiter_begin__(0, True)" in plan.code and "__arbiter_begin__(1, True)" in plan.code
    assert plan.code.startswith("import math\nx = 2\n")


def test_humaneval_check_body_asserts_are_the_tests_and_check_is_called() -> None:
    tests = (
        "METADATA = {}\n\ndef check(candidate):\n"
        "    assert candidate(1) == 2\n    y = 3\n    assert candidate(y) == 6\n"
    )
    plan = parse_reference(tests, "", "double", 100)
    assert plan.n_tests == 2
    assert plan.code.rstrip().endswith("check(double)")


def test_a_check_without_top_level_asserts_is_one_test() -> None:
    tests = (
        "def check(candidate):\n    helper = lambda x: x\n    def inner():\n        assert False\n"
    )
    plan = parse_reference(tests, "", "f", 100)
    assert plan.n_tests == 1


def test_entry_point_precedence_params_then_reference_then_prompt() -> None:
    tests = "def check(candidate):\n    assert candidate()\n"
    doc = json.dumps({"tests": tests, "entry_point": "from_ref"})
    prompt = "def first():\n    pass\n\ndef from_prompt():\n    '''doc'''\n"
    assert parse_reference(doc, prompt, "from_params", 9).code.endswith("check(from_params)")
    assert parse_reference(doc, prompt, None, 9).code.endswith("check(from_ref)")
    assert parse_reference(tests, prompt, None, 9).code.endswith("check(from_prompt)")


def test_stdio_pairs_from_a_list_or_an_object() -> None:
    pairs = [{"input": "1\n", "output": "2\n"}, {"output": "x"}]  # input defaults to empty
    plan = parse_reference(json.dumps(pairs), "", None, 9)
    assert plan.kind == "stdio" and plan.n_tests == 2 and plan.cases[1]["input"] == ""
    plan = parse_reference(json.dumps({"tests": pairs}), "", None, 9)
    assert plan.kind == "stdio" and plan.n_tests == 2


def test_python_test_code_starting_with_a_bracket_is_still_code() -> None:
    plan = parse_reference("[x] = [1]\nassert x == 1\n", "", None, 9)
    assert plan.kind == "tests" and plan.n_tests == 1


@pytest.mark.parametrize(
    ("reference", "words"),
    [
        (None, "holds no tests"),
        ("   ", "holds no tests"),
        ("print(1)\n", "no assert"),
        ("assert (\n", "does not parse"),
        ("[]", "empty"),
        ('[{"input": 1, "output": "1"}]', "reference test 0"),
        ('{"tests": 5}', "expected Python test code"),
        ('{"tests": "assert 1", "entry_point": "not an id"}', "entry_point"),
        ("assert f()\n" * 10, "limit is 9"),
        ("assert True\nassert 1 == 1, 'msg'\n", "no assert statement that depends"),
    ],
)
def test_unusable_references_say_why(reference: str | None, words: str) -> None:
    with pytest.raises(ReferenceError_, match=words):
        parse_reference(reference, "", None, 9)


def test_asserts_that_name_nothing_are_no_tests() -> None:
    # HumanEval's check functions hold `assert True` lines: they hold for any program
    tests = (
        "def check(candidate):\n    assert candidate(1) == 2\n    assert True\n"
        "    assert True, 'This prints if this assert fails'\n    assert candidate(2) == 3\n"
    )
    plan = parse_reference(tests, "", "f", 100)
    assert plan.n_tests == 2
    plan = parse_reference("assert 1 == 1\nassert f(1) == 1\nassert -1 < 0\n", "", None, 9)
    assert plan.n_tests == 1


def test_the_names_the_tests_use_and_do_not_define_are_the_programs() -> None:
    plan = parse_reference("import math\nx = 2\nassert f(x) == math.sqrt(g(4))\n", "", None, 9)
    assert plan.names == ("f", "g")  # math and x are the tests' own; the wrapping's are not
    plan = parse_reference(
        "def check(candidate):\n    assert candidate(1) == sum([1])\n", "", "h", 9
    )
    assert plan.names == ("h", "sum")  # a builtin: the checker keeps it unless the program's
    assert plan.job()["secret"]["names"] == ["h", "sum"] and "tests" not in plan.job()


def test_an_assert_depends_on_the_program_when_it_reads_a_value_got_from_it() -> None:
    tests = (
        "f(1)\ny = 2\nassert y == 2\n"  # the tests' own value: counts only if it calls f
        "r = f(3)\nassert r == 4\n"  # set from a call of the program
        "xs = []\nxs.append(f(1))\nassert xs == [2]\n"  # changed with a value of it
        "zs = [1]\nsort_it(zs)\nassert zs == [1]\n"  # handed to the program
        "assert f(1) == 2\n"
    )
    plan = parse_reference(tests, "", None, 100)
    assert "__arbiter_begin__(0, False)" in plan.code
    for i in range(1, 5):
        assert f"__arbiter_begin__({i}, True)" in plan.code


def test_humaneval_setup_from_candidate_counts_for_the_asserts_after_it() -> None:
    tests = (
        "def check(candidate):\n    out = candidate(2)\n    assert out == 4\n"
        "    assert 2 == 2 + 0 * len([])\n"
    )
    plan = parse_reference(tests, "", "double", 100)
    assert "__arbiter_begin__(0, True)" in plan.code
    assert "__arbiter_begin__(1, False)" in plan.code
