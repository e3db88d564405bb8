"""Stdin/stdout idioms that ``python3 prog.py`` runs correctly pass, and a Python grader's
edge values are rewards only when they are finite numbers in the range (the rest null
``grader_error``), through the real sandbox service."""

from __future__ import annotations

import json

import pytest

from tests.services.sandbox.conftest import Sandbox, group

SUM = json.dumps([{"input": "2 3\n", "output": "5\n"}, {"input": "4 4\n", "output": "8"}])
STDIO = {
    "sys.stdin.read": "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n",
    "input until EOFError": "s = 0\nwhile True:\n    try:\n        line = input()\n"
    "    except EOFError:\n        break\n    s += sum(map(int, line.split()))\nprint(s)\n",
    "open(0)": "print(sum(map(int, open(0).read().split())))\n",
    "sys.stdout.write": "import sys\nsys.stdout.write(str(sum(map(int, input().split()))))\n",
    "print end=''": "print(sum(map(int, input().split())), end='')\n",
    "__main__ guard": "def main():\n    print(sum(map(int, input().split())))\n\n"
    "if __name__ == '__main__':\n    main()\n",
    "for line in sys.stdin": "import sys\nfor line in sys.stdin:\n"
    "    print(sum(map(int, line.split())))\n",
    "sys.stdin.buffer": "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n",
    "sys.exit(0)": "import sys\nprint(sum(map(int, input().split())))\nsys.exit(0)\n",
    "joined thread": "import threading\ndef main():\n    print(sum(map(int, input().split())))\n"
    "t = threading.Thread(target=main)\nt.start()\nt.join()\n",
    "debug output on stderr": "import sys\na, b = map(int, input().split())\n"
    "print('read', a, b, file=sys.stderr)\nprint(a + b)\n",
    "fenced with a usage note": "Read the numbers:\n```python\na, b = map(int, input().split())\n"
    "print(a + b)\n```\nRun: `python3 sol.py < in.txt`\n",
}


@pytest.mark.parametrize("program", STDIO.values(), ids=STDIO.keys())
def test_stdin_stdout_idioms_pass(sandbox: Sandbox, program: str) -> None:
    g = sandbox.score("code_tests", [group(SUM, program)])["groups"][0]
    assert g["scores"] == [1.0], g


GRADES = {
    "1": 1.0,
    "0": 0.0,
    "0.5": 0.5,
    "-0.0": 0.0,
    "1e308": None,
    "float('inf')": None,
    "float('nan')": None,
    "'0.5'": None,
    "None": None,
}


@pytest.mark.parametrize(("value", "want"), GRADES.items(), ids=GRADES.keys())
def test_grader_edge_values(sandbox: Sandbox, value: str, want: float | None) -> None:
    source = f"def grade(sample, item):\n    return {value}\n"
    g = sandbox.score("python_grader", [group("r", "x")], {"source": source})["groups"][0]
    assert g["scores"] == [want], g
    if want is None:
        assert g["errors"][0]["kind"] == "grader_error", g
