"""Stdin/stdout programs end as under ``python3 prog.py``: ``atexit`` handlers run and what
they print counts, non-daemon threads are joined, ``exit()``/``quit()``/``sys.exit()`` work
and the exit status is Python's (the sandbox's interpreter runs without ``site``)."""

from __future__ import annotations

import json

import pytest

from tests.services.sandbox.conftest import Sandbox, group

CASES = json.dumps([{"input": "2 3\n", "output": "5\n"}, {"input": "4 4\n", "output": "8\n"}])


@pytest.mark.parametrize(
    "program",
    [
        # the fast-IO idiom: everything printed by a handler at exit
        "import atexit, io, sys\nout = io.StringIO()\natexit.register(lambda: "
        "sys.stdout.write(out.getvalue()))\na, b = map(int, input().split())\n"
        "print(a + b, file=out)\n",
        # main in a non-daemon thread, never joined
        "import threading\ndef main():\n    a, b = map(int, input().split())\n    print(a + b)\n"
        "threading.stack_size(1 << 24)\nthreading.Thread(target=main).start()\n",
        "a, b = map(int, input().split())\nprint(a + b)\nexit()\nprint('not this')\n",
        "a, b = map(int, input().split())\nprint(a + b)\nquit(0)\n",
        "import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit()\n",
        "import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(None)\n",
    ],
    ids=["atexit", "non-daemon thread", "exit()", "quit(0)", "sys.exit()", "sys.exit(None)"],
)
def test_a_program_that_python_runs_correctly_passes(sandbox: Sandbox, program: str) -> None:
    g = sandbox.score("code_tests", [group(CASES, program)])["groups"][0]
    assert g["scores"] == [1.0], g


@pytest.mark.parametrize(
    ("program", "reason"),
    [
        ("print(5)\nexit(3)\n", "exited with status 3"),
        ("import sys\nprint(5)\nsys.exit('bad input')\n", "bad input"),
        ("import atexit\natexit.register(lambda: 1 / 0)\nprint(5)\n", None),
    ],
    ids=["exit(3)", "sys.exit(message)", "raising atexit handler"],
)
def test_the_exit_status_is_pythons(sandbox: Sandbox, program: str, reason: str | None) -> None:
    g = sandbox.score("code_tests", [group(CASES, program)])["groups"][0]
    if reason is None:  # Python prints the handler's error and still exits 0
        assert g["scores"] == [0.5], g
        return
    assert g["scores"] == [0.0], g
    assert reason in g["info"]["failed"][0]["0"], g
