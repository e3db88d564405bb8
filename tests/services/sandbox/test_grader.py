"""``python_grader``: a team's ``grade(sample, item)`` run in the sandbox per response.

The grader is the team's own code, so its failures are null with the reason
(``grader_error``), never 0: an exception, a timeout, a grade that is not a finite number
inside ``params.score_range`` ([0, 1] by default, OpenAI's range). A source that does not
compile never reaches the service (the params model refuses it: 422 naming
``params.source``). As OpenAI's Python graders, a grader may import the packages OpenAI's
image offers (``packages.py``) and reads the row's metadata from ``item``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_service
from tests.services.sandbox.conftest import ENV, Sandbox, group

LENGTH = "def grade(sample, item):\n    return min(1.0, len(sample['output_text']) / 10)\n"
ITEM = (
    "def grade(sample, item):\n"
    "    ok = item['reference'] in sample['output_text']\n"
    "    return float(ok) * item['metadata']['scale'] + (item['prompt'] == 'Q') * 0.5\n"
)


def _deep(n: int) -> object:
    value: object = 1
    for _ in range(n):
        value = [value]
    return value


def grade(sandbox: Sandbox, source: str, *responses: str, **params: object) -> dict[str, Any]:
    body = sandbox.score(
        "python_grader",
        [group("42", *responses, prompt="Q")],
        {"source": source, **params},
    )
    return dict(body["groups"][0])


def test_grade_sees_the_response_and_the_item(sandbox: Sandbox) -> None:
    assert grade(sandbox, LENGTH, "12345", "x" * 40)["scores"] == [0.5, 1.0]
    g = grade(sandbox, ITEM, "it is 42", "no", metadata={"scale": 2}, score_range=[0, 3])
    assert g["scores"] == [2.5, 0.5], g


# item as the grader sees it, and sample's parsed JSON: the grade says which parts arrived
SEES = """
def grade(sample, item):
    m = item["metadata"]
    checks = [
        m == {"scale": 2, "answer": "42", "shared": "row"},  # params.metadata under the row's
        item["answer"] == "42" and item["shared"] == "row",  # keys at the top, as OpenAI rows
        item["prompt"] == "Q" and item["reference"] == "ref",  # the group's own fields kept
        sample["output_json"] == ({"a": [1, 2]} if sample["output_text"].startswith("{") else None),
    ]
    return sum(checks) / len(checks)
"""


def test_each_rows_metadata_and_the_parsed_json_reach_the_grader(sandbox: Sandbox) -> None:
    row = {
        **group("ref", '{"a": [1, 2]}', "not json", prompt="Q"),
        "metadata": {"answer": "42", "shared": "row"},
    }
    params = {"source": SEES, "metadata": {"scale": 2, "shared": "recipe"}}
    body = sandbox.score("python_grader", [row], params)
    assert body["groups"][0]["scores"] == [1.0, 1.0], body


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("1e308", "outside params.score_range [0, 1]"),  # finite, far too large
        ("1.5", "outside params.score_range [0, 1]"),
        ("-0.25", "outside params.score_range [0, 1]"),
        ("float('inf')", "not a finite number"),
        ("float('-inf')", "not a finite number"),
        ("float('nan')", "not a finite number"),
        ("10 ** 400", "too large"),  # an int no float holds
    ],
)
def test_a_grade_outside_the_range_or_not_finite_is_null_with_the_reason(
    sandbox: Sandbox, value: str, words: str
) -> None:
    g = grade(sandbox, f"def grade(sample, item):\n    return {value}\n", "x")
    assert g["scores"] == [None], g
    (error,) = g["errors"]
    assert error["kind"] == "grader_error" and words in error["message"], error


def test_the_range_is_the_recipes_choice_and_its_ends_are_grades(sandbox: Sandbox) -> None:
    source = "def grade(sample, item):\n    return float(sample['output_text'])\n"
    g = grade(sandbox, source, "-2", "10", "10.5", score_range=[-2, 10])
    assert g["scores"] == [-2.0, 10.0, None], g


# What OpenAI's Python graders import, each doing real work (and BLAS with one thread).
PACKAGES = """
import numpy as np, scipy.optimize, sympy, pandas as pd
from rapidfuzz import fuzz
import jsonschema, pydantic, yaml, sqlparse, deepdiff

def grade(sample, item):
    checks = [
        float(np.linalg.solve(np.array([[2.0, 0.0], [0.0, 4.0]]), np.array([2.0, 8.0]))[1]) == 2.0,
        abs(scipy.optimize.brentq(lambda x: x * x - 2, 0, 2) - 2 ** 0.5) < 1e-9,
        sympy.simplify(sympy.sympify(sample["output_text"]) - sympy.sympify("(x+1)**2")) == 0,
        pd.DataFrame({"a": [1, 2, 3]})["a"].sum() == 6,
        fuzz.ratio("arbiter", "arbitre") > 70,
        jsonschema.Draft7Validator({"type": "integer"}).is_valid(3),
        yaml.safe_load("a: [1, 2]") == {"a": [1, 2]},
        sqlparse.format("select 1", keyword_case="upper") == "SELECT 1",
        not deepdiff.DeepDiff({"a": 1}, {"a": 1}),
        pydantic.TypeAdapter(int).validate_python("5") == 5,
    ]
    return sum(checks) / len(checks)
"""
HEAVY = """
import sklearn.metrics, nltk, ast_grep_py
from rouge_score import rouge_scorer

def grade(sample, item):
    f1 = sklearn.metrics.f1_score([1, 0, 1], [1, 0, 1])
    rouge = rouge_scorer.RougeScorer(["rouge1"]).score("a b c", sample["output_text"])
    root = ast_grep_py.SgRoot("x = 1", "python").root()
    return (f1 + rouge["rouge1"].fmeasure + (root.find(pattern="x = $A") is not None)) / 3
"""


@pytest.fixture(scope="module")
def roomy(log_dir: Path) -> Iterator[Sandbox]:
    """A sandbox service whose limits let a grader import heavy packages (seconds of CPU:
    the session's sandbox allows 2 s a test and 6 s a response)."""
    env = {**ENV, "SANDBOX_TEST_TIMEOUT_S": "30", "SANDBOX_ITEM_TIMEOUT_S": "90"}
    proc, url = start_service("sandbox", log_dir, env)
    yield Sandbox(url, "", Path("/nonexistent"))
    proc.stop()


def test_openais_grader_packages_import_and_work(roomy: Sandbox) -> None:
    g = grade(roomy, PACKAGES, "x**2 + 2*x + 1", timeout_s=30)
    assert g["scores"] == [1.0], g
    g = grade(roomy, HEAVY, "a b c", timeout_s=30)
    assert g["scores"] == [1.0], g


@pytest.mark.parametrize(
    ("value", "score"),
    [
        ("np.int64(1)", 1.0),  # np.sum of booleans: an int64, not an int
        ("np.float32(0.5)", 0.5),
        ("np.mean([0.0, 1.0])", 0.5),  # a float64, a float subclass
        ("np.bool_(True)", None),  # a boolean is no grade, numpy's as Python's
    ],
)
def test_numpy_numbers_are_grades(roomy: Sandbox, value: str, score: float | None) -> None:
    source = f"import numpy as np\ndef grade(sample, item):\n    return {value}\n"
    g = grade(roomy, source, "x", timeout_s=30)
    assert g["scores"] == [score], g
    if score is None:
        assert "not a number" in g["errors"][0]["message"], g


def test_a_program_under_code_tests_gets_no_grader_packages(sandbox: Sandbox) -> None:
    # the packages are the graders': a program sees the standard library only, as before
    program = (
        "def has_numpy():\n    try:\n        import numpy\n    except ImportError:\n"
        "        return False\n    return True\n"
    )
    body = sandbox.score("code_tests", [group("assert has_numpy() == False\n", program)])
    assert body["groups"][0]["scores"] == [1.0], body


@pytest.mark.parametrize(
    ("source", "words"),
    [
        # raises: null with the exception, never 0
        ("def grade(sample, item):\n    raise KeyError('boom')\n", "KeyError"),
        # loops past its time
        ("def grade(sample, item):\n    while True:\n        pass\n", "timeout"),
        # not a finite number
        ("def grade(sample, item):\n    return float('nan')\n", "not a finite number"),
        ("def grade(sample, item):\n    return float('inf')\n", "not a finite number"),
        # not a number at all
        ("def grade(sample, item):\n    return 'high'\n", "not a number"),
        ("def grade(sample, item):\n    return True\n", "not a number"),
        # exits instead of answering
        ("import os\ndef grade(sample, item):\n    os._exit(0)\n", "no result"),
        # fails while its module loads
        (
            "import no_such_module\ndef grade(sample, item):\n    return 1.0\n",
            "ModuleNotFoundError",
        ),
        # the service's own packages are not the graders': hidden
        ("import fastapi\ndef grade(sample, item):\n    return 1.0\n", "ModuleNotFoundError"),
        # prints without end
        ("def grade(sample, item):\n    while True:\n        print('x' * 10000)\n", "output limit"),
    ],
)
def test_a_failing_grader_is_null_with_the_reason(
    sandbox: Sandbox, source: str, words: str
) -> None:
    g = grade(sandbox, source, "a response", timeout_s=1.0)
    assert g["scores"] == [None], g
    (error,) = g["errors"]
    assert error["kind"] == "grader_error" and words in error["message"], error


@pytest.mark.parametrize(
    ("params", "param", "words"),
    [
        ({"source": "def grade(:\n"}, "params.source", "does not compile"),
        ({"source": "def other(sample, item):\n    return 1\n"}, "params.source", "grade"),
        ({"source": "x" * 70_000}, "params.source", "at most"),
        ({"source": LENGTH, "timeout_s": 0}, "params.timeout_s", "greater than"),
        ({"source": LENGTH, "score_range": [1, 0]}, "params.score_range", "min < max"),
        ({"source": LENGTH, "score_range": [0, 1e9]}, "params.score_range", "at most"),
    ],
)
def test_bad_grader_params_are_422_naming_the_field(
    sandbox: Sandbox, params: dict[str, object], param: str, words: str
) -> None:
    r = sandbox.post("/v1/python_grader", {"groups": [group("", "x")], "params": params})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ("a string", "valid dictionary"),
        ([1, 2], "valid dictionary"),
        ({"x": "y" * 100_001}, "more than 100000 characters"),
        ({"a": {"b": {"c": 1}}} | {"deep": _deep(40)}, "nested more than"),
    ],
)
def test_bad_row_metadata_is_422_naming_the_group(
    sandbox: Sandbox, metadata: object, words: str
) -> None:
    row = {**group("", "x"), "metadata": metadata}
    r = sandbox.post("/v1/python_grader", {"groups": [row], "params": {"source": LENGTH}})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"].startswith("groups.0.metadata") and words in error["message"], error


@pytest.fixture(scope="module")
def gateway(log_dir: Path, verify_url: str, redis_url: str, sandbox: Sandbox) -> Iterator[str]:
    env = {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url}
    proc, url = start_service("gateway", log_dir, {**env, "GATEWAY_SANDBOX_URL": sandbox.url})
    yield url
    proc.stop()


def test_row_metadata_reaches_the_grader_through_the_gateway_and_keys_its_cache(
    gateway: str,
) -> None:
    source = "def grade(sample, item):\n    return float(sample['output_text'] == item['answer'])\n"
    recipe = {"components": [{"name": "python_grader", "params": {"source": source}}]}
    prompt = f"p {time.monotonic_ns()}"  # nothing cached yet

    def row(answer: str) -> dict[str, Any]:
        return {**group("", "42", prompt=prompt), "metadata": {"answer": answer}}

    # the same prompt, reference and response in two rows: only the metadata differs
    body = {"recipe": recipe, "groups": [row("42"), row("41")]}
    r = httpx.post(f"{gateway}/v1/score", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert [g["rewards"] for g in r.json()["groups"]] == [[1.0], [0.0]]
    # again, now from the cache: each row's own score, not the other's
    again = httpx.post(f"{gateway}/v1/score", json=body, timeout=60).json()
    assert [g["rewards"] for g in again["groups"]] == [[1.0], [0.0]]
    assert again["usage"]["cache_hits"] == 2
    bad = {"recipe": recipe, "groups": [{**row("x"), "metadata": ["not", "an", "object"]}]}
    r = httpx.post(f"{gateway}/v1/score", json=bad, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["param"] == "groups.0.metadata", r.text
