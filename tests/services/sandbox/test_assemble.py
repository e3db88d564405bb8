"""The program built from a response (``assemble.py``): pure functions, no sandbox.

Each case says which dataset convention it follows: human-eval's harness runs
``prompt + completion``; evalplus's sanitizer keeps the block that defines the entry point
and what it needs; a stdin/stdout program is the block that reads input.
"""

from __future__ import annotations

import json

import pytest

from arbiter.services.sandbox.assemble import Wanted, extract_program, prompt_entry, wanted
from tests.services.sandbox.conftest import Sandbox, group

# A HumanEval row: the prompt imports, defines a helper, and ends with the function to write.
PROMPT = (
    "import math\nfrom typing import List\n\n\n"
    "def poly(xs: list, x: float):\n"
    '    """Evaluates the polynomial xs at x."""\n'
    "    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n\n\n"
    "def find_zero(xs: List[float]) -> float:\n"
    '    """Finds x such that poly(xs, x) == 0."""\n'
)
CHECK = "def check(candidate):\n    assert abs(poly([1, 2], candidate([1, 2]))) < 1e-6\n"
HE = wanted(json.dumps({"tests": CHECK, "entry_point": "find_zero"}), PROMPT, None, False)
BODY = "    return -xs[0] / xs[1]\n"
FULL = "def find_zero(xs: List[float]) -> float:\n    return -xs[0] / xs[1]\n"


def fence(code: str, tag: str = "python") -> str:
    return f"```{tag}\n{code}```\n"


def run(program: str, call: str) -> object:
    scope: dict[str, object] = {}
    exec(compile(program, "<program>", "exec"), scope)
    return eval(call, scope)


def test_what_the_tests_need_entry_point_and_the_names_they_use() -> None:
    # builtins too (abs): a response may define a function of that name (MBPP/126's sum)
    assert HE.entry == "find_zero" and HE.names == {"find_zero", "poly", "abs"}
    # params.entry_point first, as parse_reference resolves it
    assert wanted(CHECK, PROMPT, "other", False).entry == "other"
    # HumanEval-style tests without a named entry point: the prompt's last function
    assert wanted(CHECK, PROMPT, None, False).entry == "find_zero"
    # plain asserts (MBPP): what they call; a prompt function they never call is not it
    mbpp = wanted("import math\nassert area(2) == 4\n", "Write a function area.", None, False)
    assert mbpp.entry is None and mbpp.names == {"area"}
    assert wanted("assert area(2) == 4\n", PROMPT, None, False).entry is None
    assert wanted('[{"input": "1", "output": "1"}]', "", None, True) == Wanted(stdio=True)
    assert prompt_entry(PROMPT) == "find_zero" and prompt_entry("prose") is None


@pytest.mark.parametrize(
    "response",
    [
        BODY,  # human-eval's own format: the completion is the body
        "\n" + BODY + "\n\n\ndef unused():\n    pass\n",  # a body, then more definitions
        "Here is the body:\n" + fence(BODY),  # a fenced body keeps its indentation
    ],
)
def test_a_body_only_completion_runs_as_prompt_plus_completion(response: str) -> None:
    program = extract_program(response, HE)
    if "```" not in response:
        assert program == PROMPT + response  # exactly what human-eval's harness runs
    assert run(program, "find_zero([1, 2])") == -0.5


def test_a_full_function_gets_what_it_needs_from_the_prompt() -> None:
    # List and poly are the prompt's: prompt + completion would have them too
    program = extract_program(fence(FULL), HE)
    assert run(program, "find_zero([2, 4])") == -0.5 and run(program, "poly([1], 3)") == 1
    assert program.endswith(FULL) and '"""Finds x' not in program  # not the prompt's stub


def test_a_usage_example_block_is_left_out() -> None:
    response = "Solution:\n" + fence(FULL) + "\nExample:\n" + fence("print(find_zero([1, 2]))\n")
    program = extract_program(response, HE)
    assert "print" not in program and run(program, "find_zero([1, 2])") == -0.5
    # an example that would fail the program (a wrong expectation) changes nothing
    wrong = fence(FULL) + "\n" + fence("assert find_zero([1, 2]) == 7\n")
    assert "== 7" not in extract_program(wrong, HE)


def test_the_block_defining_the_entry_point_takes_definitions_from_other_blocks() -> None:
    helper = "EPS = 1e-9\n\ndef ratio(a, b):\n    return a / (b + EPS)\n\nprint(ratio(1, 2))\n"
    main = "def find_zero(xs):\n    return -ratio(xs[0], xs[1])\n"
    program = extract_program(fence(helper) + fence(main) + fence("find_zero([1])\n"), HE)
    assert "print" not in program and "find_zero([1])" not in program
    assert abs(run(program, "find_zero([1, 2])") + 0.5) < 1e-6  # type: ignore[operator]


def test_the_last_block_defining_the_entry_point_wins() -> None:
    first = "def find_zero(xs):\n    return 0.0\n"
    program = extract_program(fence(first) + "\nFixed:\n" + fence(FULL), HE)
    assert run(program, "find_zero([1, 2])") == -0.5


def test_plain_assert_tests_choose_the_block_defining_what_they_call() -> None:
    want = wanted("assert area(2) == 4\nassert area(0) == 0\n", "Write area.", None, False)
    response = fence("def area(s):\n    return s * s\n") + fence("print(area(3))\n")
    assert extract_program(response, want) == "def area(s):\n    return s * s\n"


def test_a_function_named_like_a_builtin_is_what_the_tests_call() -> None:
    # MBPP/126 asks for sum(a, b): the block defining it is the program, not the example
    want = wanted("assert sum(10, 15) == 6\n", "Write a function sum.", None, False)
    solution = "def sum(a, b):\n    return 6\n"
    assert extract_program(fence(solution) + fence("print(sum(10, 15))\n"), want) == solution


def test_stdio_takes_the_last_block_that_reads_input_with_its_helpers() -> None:
    want = wanted('[{"input": "3\\n", "output": "9\\n"}]', "Square n.", None, True)
    helper = "def sq(n):\n    return n * n\n\nprint(sq(4))\n"
    reads = "import sys\nn = int(sys.stdin.readline())\nprint(sq(n))\n"
    response = fence(helper) + fence(reads) + fence("$ python3 sq.py < in.txt\n", "bash")
    program = extract_program(response, want)
    assert program.endswith(reads) and "print(sq(4))" not in program and "def sq" in program


def test_stdio_takes_a_later_block_that_calls_the_function_reading_input() -> None:
    want = Wanted(stdio=True)
    reads = "def solve(n):\n    return n * n\n\ndef main():\n    print(solve(int(input())))\n"
    call = "if __name__ == '__main__':\n    main()\n"
    example = "print(solve(4))  # 16\n"
    program = extract_program(fence(reads) + fence(call) + fence(example), want)
    assert program.endswith(call) and "def main" in program and "def solve" in program
    assert "print(solve(4))" not in program
    # an example that calls only a helper is no program: the reading block stays the program
    assert extract_program(fence(reads + "main()\n") + fence(example), want).endswith("main()\n")


@pytest.mark.parametrize(
    "reader",
    ["n = input()", "import sys\nn = sys.stdin.read()", "n = open(0).read()",
     "import fileinput\nn = list(fileinput.input())", "from sys import stdin\nn = stdin.read()"],
)  # fmt: skip
def test_every_way_of_reading_input_marks_the_stdio_block(reader: str) -> None:
    want = Wanted(stdio=True)
    program = extract_program(fence(reader + "\nprint(n)\n") + fence("print('example')\n"), want)
    assert program.startswith(reader.split("\n")[0])


@pytest.mark.parametrize(
    ("response", "program"),
    [
        ("def f():\n    return 1\n", "def f():\n    return 1\n"),  # no fence: all of it
        ("Sure:\n```python\nx = 1\n```\nDone.", "x = 1\n"),  # one fenced block
        ("```\nx = 1\n```\nthen\n```py\nx = 2\n```", "x = 2\n"),  # the last one counts
        ("  ```python\n  y = 3\n  ```", "y = 3\n"),  # indented fences: dedented
        ("```python\nunclosed = 1\n", "unclosed = 1\n"),  # a fence never closed: its code
        ("```python\nz = 1\n```\n```text\nz equals one\n```", "z = 1\n"),  # the last that is Python
        ("```python\nbroken(\n```", "broken(\n"),  # none is Python: the last, to fail as is
    ],
)
def test_without_needs_the_program_is_the_last_python_block(response: str, program: str) -> None:
    assert extract_program(response) == program


@pytest.mark.parametrize(
    ("response", "program"),
    [
        # prose around code without fences: the code alone (evalplus's code_extract)
        (
            "Here is the solution:\n\nimport math\n\ndef area(r):\n    return math.pi * r * r\n"
            "\nIt returns the area. Example: area(1) is about 3.14.\n",
            "import math\n\ndef area(r):\n    return math.pi * r * r\n\n",
        ),
        (
            "Sure!\nn = int(input())\nprint(n * n)\nThat reads n.\n",
            "n = int(input())\nprint(n * n)\n",
        ),
        # prose that starts like a statement but is none is passed over
        (
            "for example, this one:\ndef area(r): return 3 * r * r\n",
            "def area(r): return 3 * r * r\n",
        ),
        # nothing in it parses: left as written, to fail with its own syntax error
        ("Area is pi r squared.\nUse it.\n", "Area is pi r squared.\nUse it.\n"),
    ],
)
def test_unfenced_code_in_prose_is_the_longest_run_that_parses(response: str, program: str) -> None:
    want = wanted("assert area(1) > 3\n", "Write area.", None, False)
    assert extract_program(response, want) == program


def test_an_unfenced_body_with_helpers_after_it_is_still_a_body_only_completion() -> None:
    response = (
        BODY.replace("-xs[0] / xs[1]", "flip(xs)")
        + "\n\ndef flip(xs):\n    return -xs[0] / xs[1]\n"
    )
    assert run(extract_program(response, HE), "find_zero([1, 2])") == -0.5


def test_a_future_import_stays_first_when_definitions_are_added() -> None:
    code = "from __future__ import annotations\n\ndef find_zero(xs: List[float]):\n"
    program = extract_program(fence(code + "    return -xs[0] / xs[1]\n"), HE)
    assert program.startswith("from __future__ import annotations\n")
    assert run(program, "find_zero([1, 2])") == -0.5


def test_a_body_that_does_not_compile_with_the_prompt_is_left_as_written() -> None:
    # prompt + completion is no program either: the response fails with its own error
    response = "    return (-xs[0] /\n"
    assert extract_program(response, HE) == response


# ------------------------------------------------------------------ through the real sandbox

HE_TESTS = (
    "def check(candidate):\n"
    "    assert abs(candidate([1, 2]) + 0.5) < 1e-9\n"
    "    assert abs(poly([4, 2], candidate([4, 2]))) < 1e-9\n"
)
HE_REFERENCE = json.dumps({"tests": HE_TESTS, "entry_point": "find_zero"})


@pytest.mark.parametrize(
    "response",
    [
        BODY,  # body-only, as human-eval's samples are
        fence(FULL),  # a full function needing the prompt's List and poly
        "Solution:\n" + fence(FULL) + "Usage:\n" + fence("print(find_zero([1, 2]))\n"),
        fence(FULL) + fence("assert find_zero([1, 2]) == 99  # a wrong example\n"),
        BODY + "    # " + "x" * 10_000 + "\n",  # long: assembled off the event loop
    ],
    ids=["body-only", "full-function", "usage-example", "wrong-example", "long"],
)
def test_dataset_conventions_score_correct_work_in_the_sandbox(
    sandbox: Sandbox, response: str
) -> None:
    body = sandbox.score("code_tests", [group(HE_REFERENCE, response, prompt=PROMPT)])
    assert body["groups"][0]["scores"] == [1.0], body


def test_a_stdio_answer_with_helpers_and_an_example_scores_in_the_sandbox(
    sandbox: Sandbox,
) -> None:
    reference = json.dumps([{"input": "3\n", "output": "9\n"}, {"input": "5\n", "output": "25\n"}])
    helper = "def sq(n):\n    return n * n\n\nprint(sq(4))\n"
    reads = "n = int(input())\nprint(sq(n))\n"
    response = (
        fence(helper) + "Run it:\n" + fence(reads) + fence("$ echo 3 | python3 sq.py\n9\n", "bash")
    )
    body = sandbox.score("code_tests", [group(reference, response, prompt="Print n squared.")])
    assert body["groups"][0]["scores"] == [1.0], body
