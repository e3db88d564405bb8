"""``python_grader``: a team's ``grade(sample, item)`` run in the sandbox per response.

The grader is the team's own code, so its failures are null with the reason
(``grader_error``), never 0; a source that does not compile never reaches the service
(the params model refuses it: 422 naming ``params.source``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.services.sandbox.conftest import Sandbox, group

LENGTH = "def grade(sample, item):\n    return min(1.0, len(sample['output_text']) / 10)\n"
ITEM = (
    "def grade(sample, item):\n"
    "    ok = item['reference'] in sample['output_text']\n"
    "    return float(ok) * item['metadata']['scale'] + (item['prompt'] == 'Q') * 0.5\n"
)


def grade(sandbox: Sandbox, source: str, *responses: str, **params: object) -> dict[str, Any]:
    body = sandbox.score(
        "python_grader",
        [group("42", *responses, prompt="Q")],
        {"source": source, **params},
    )
    return dict(body["groups"][0])


def test_grade_sees_the_response_and_the_item(sandbox: Sandbox) -> None:
    assert grade(sandbox, LENGTH, "12345", "x" * 40)["scores"] == [0.5, 1.0]
    g = grade(sandbox, ITEM, "it is 42", "no", metadata={"scale": 2})
    assert g["scores"] == [2.5, 0.5], g


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
    ],
)
def test_bad_grader_params_are_422_naming_the_field(
    sandbox: Sandbox, params: dict[str, object], param: str, words: str
) -> None:
    r = sandbox.post("/v1/python_grader", {"groups": [group("", "x")], "params": params})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
