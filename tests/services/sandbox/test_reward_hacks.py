"""Reward hacks against ``code_tests``: programs written to score tests they fail.

Each case is a response sent to a real sandbox service (``conftest.sandbox``). The reward
hacks a policy under RL finds first -- an object equal to everything, printing what the
harness is known to expect, leaving before the asserts run -- must score what the program
really passes. The hacks that subvert the harness from inside its own interpreter are
refused as well: the tests run in a checker process of their own (``checker.py``).
"""

from __future__ import annotations

import json
import platform

import pytest

from arbiter.services.sandbox.seccomp import SECCOMP_DENY
from tests.services.sandbox.conftest import Sandbox, group

TESTS = "assert f(1) == 2\nassert f(2) == 3\n"  # f(x) = x + 1; every hack below returns junk
HUMANEVAL = json.dumps(
    {
        "tests": "def check(candidate):\n"
        "    assert candidate(1) == 2\n    assert candidate(2) == 3\n",
        "entry_point": "f",
    }
)
ALWAYS_EQUAL = (
    "class AlwaysEqual:\n    def __eq__(self, other):\n        return True\n"
    "    def __ne__(self, other):\n        return False\n    __hash__ = object.__hash__\n"
)


def scores(sandbox: Sandbox, reference: str, *programs: str) -> list[float | None]:
    body = sandbox.score("code_tests", [group(reference, *programs)])
    result: list[float | None] = body["groups"][0]["scores"]
    return result


def test_an_object_equal_to_everything_passes_no_equality_assert(sandbox: Sandbox) -> None:
    hacks = [
        ALWAYS_EQUAL + "def f(x):\n    return AlwaysEqual()\n",
        # a subclass of int that says yes: brought back to the int it holds
        "class I(int):\n    def __eq__(self, o):\n        return True\n"
        "    __hash__ = int.__hash__\ndef f(x):\n    return I(0)\n",
        # inside a list: each element is compared as a plain value
        ALWAYS_EQUAL + "def f(x):\n    return [AlwaysEqual()]\n",
    ]
    assert scores(sandbox, TESTS, *hacks) == [0.0, 0.0, 0.0]
    assert scores(sandbox, HUMANEVAL, hacks[0]) == [0.0]
    listed = "assert [f(1)] == [[2]]\nassert f(1) in ([2], [3])\n"
    assert scores(sandbox, listed, hacks[2]) == [0.0]


def test_values_of_builtin_subclasses_still_compare_as_their_values(sandbox: Sandbox) -> None:
    counter = "import collections\ndef f(x):\n    return collections.Counter('a' * x)\n"
    named = "import collections\nP = collections.namedtuple('P', 'a')\ndef f(x):\n    return P(x)\n"
    tests = "assert f(2) == {'a': 2}\nassert f(1) != {'a': 2}\nassert f(1) in [{'a': 1}]\n"
    assert scores(sandbox, tests, counter) == [1.0]
    tuples = "assert f(2) == (2,)\nassert 2 in f(2)\nassert f(3) not in [(2,)]\n"
    assert scores(sandbox, tuples, named) == [1.0]
    fractions = "from fractions import Fraction\nassert f(1) == Fraction(1, 2)\n"
    half = "from fractions import Fraction\ndef f(x):\n    return Fraction(x, 2)\n"
    assert scores(sandbox, fractions, half) == [1.0]
    views = "assert f(1).keys() == {'a'}\nassert bytearray(b'a') == b'a'\n"
    assert scores(sandbox, views, counter) == [1.0]


def test_a_stdio_program_cannot_print_the_expected_output_from_its_memory(
    sandbox: Sandbox,
) -> None:
    # the program is a fork of the harness: whatever the job holds, it can find with gc
    pairs = [(1, 2), (5, 5)]
    cases = json.dumps([{"input": f"{a} {b}\n", "output": f"{a + b}\n"} for a, b in pairs])
    forge = (
        "import gc, sys\ndata = sys.stdin.read()\n"
        "for o in gc.get_objects():\n"
        "    if isinstance(o, dict) and isinstance(o.get('output'), str)"
        " and o.get('input') == data:\n"
        "        print(o['output'], end='')\n        sys.exit(0)\n"
    )
    honest = "a, b = map(int, input().split())\nprint(a + b)\n"
    assert scores(sandbox, cases, forge, honest) == [0.0, 1.0]


@pytest.mark.parametrize(
    "program",
    [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "def f(x):\n    import os\n    os._exit(0)\n",
        "def f(x):\n    raise SystemExit(0)\n",
        "def f(x):\n    raise KeyboardInterrupt\n",
        "def f(x):\n    raise GeneratorExit\n",
        # result lines without the run's nonce, on the result fd and every other
        "import os\nfor fd in range(1, 64):\n    try:\n        os.write(fd, b'0 P 0\\n0 P 1\\n')\n"
        "    except OSError:\n        pass\ndef f(x):\n    return 0\n",
        "import os\nos.dup2(1, 3)\ndef f(x):\n    return 0\n",
        "import os\nos.close(3)\ndef f(x):\n    return 0\n",
        "import builtins\nbuiltins.AssertionError = KeyError\ndef f(x):\n    return 0\n",
        "BaseException = KeyError\ndef f(x):\n    return 0\n",
        "def check(candidate):\n    pass\ndef f(x):\n    return 0\n",
        "print('passed 2/2')\ndef f(x):\n    return 0\n",
    ],
    ids=[
        "sys.exit",
        "os._exit at load",
        "os._exit in test",
        "SystemExit",
        "KeyboardInterrupt",
        "GeneratorExit",
        "forged lines",
        "dup2 onto fd 3",
        "close fd 3",
        "patch AssertionError",
        "rebind BaseException",
        "own check",
        "printed verdict",
    ],
)
def test_leaving_early_or_forging_without_the_nonce_scores_nothing(
    sandbox: Sandbox, program: str
) -> None:
    assert scores(sandbox, TESTS, program) == [0.0]
    assert scores(sandbox, HUMANEVAL, program) == [0.0]


def test_long_failure_reasons_do_not_fail_the_tests_after_them(sandbox: Sandbox) -> None:
    # 300 failures of 300 characters each are more than the result pipe's frame limit:
    # the 212 tests after them still pass (512 is the default SANDBOX_MAX_TESTS)
    program = "def f(x):\n    if x:\n        return 1\n    raise ValueError('x' * 400)\n"
    reference = "assert f(0)\n" * 300 + "assert f(1)\n" * 212
    assert scores(sandbox, reference, program) == [pytest.approx(212 / 512)]


def test_junk_on_the_answer_pipe_fails_the_test(sandbox: Sandbox) -> None:
    # fd 3 is the program's answers to the checker: junk there is no value, the test fails
    program = "import os\ndef f():\n    os.write(3, b'junk\\n' * 100000)\n    return 1\n"
    body = sandbox.score("code_tests", [group("assert f()\nassert f()\n", program)])
    g = body["groups"][0]
    assert g["scores"] == [0.0]
    assert all("cannot be read" in r for r in g["info"]["failed"][0].values()), g


@pytest.mark.skipif(platform.machine() not in SECCOMP_DENY, reason="no seccomp filter here")
def test_memory_held_beyond_the_memory_limit_is_refused(sandbox: Sandbox) -> None:
    # a memfd written and never mapped held 960 MB a process, past RLIMIT_AS and /tmp
    # and System V segments, filled and detached, 1.5 GB
    program = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\ndef f():\n    try:\n"
        "        os.memfd_create('m')\n    except PermissionError:\n        return 1\n"
        "def g():\n    ok = libc.shmget(0, 1 << 20, 0o1600) == -1\n"
        "    return int(ok and ctypes.get_errno() == 1)\n"
    )
    assert scores(sandbox, "assert f() == 1\nassert g() == 1\n", program) == [1.0]


@pytest.mark.parametrize("depth", [900, 3000])
def test_a_deeply_nested_reference_is_an_invalid_reference_not_a_500(
    sandbox: Sandbox, depth: int
) -> None:
    reference = "assert f(1) == 2\nassert " + "-" * depth + "f(1)\n"
    body = sandbox.score("code_tests", [group(reference, "def f(x):\n    return x + 1\n")])
    g = body["groups"][0]
    assert g["scores"] == [None]
    assert g["errors"][0]["kind"] == "invalid_reference", g


def test_empty_files_in_tmp_are_bounded(sandbox: Sandbox) -> None:
    # empty files cost kernel memory, not /tmp's bytes (~300k files, ~300 MB of slab, in
    # 0.8 s, when only the bytes were bounded): SANDBOX_TMP_INODES bounds their number
    program = (
        "import os\ndef f():\n    for n in range(200_000):\n        try:\n"
        "            os.close(os.open(f'/tmp/{n}', os.O_CREAT | os.O_WRONLY))\n"
        "        except OSError:\n            return n\n    return n + 1\n"
    )
    body = sandbox.score("code_tests", [group("assert f() < 200_000, f()\n", program)])
    assert body["groups"][0]["scores"] == [1.0], body["groups"][0]["info"]


def test_a_program_calling_the_harness_hooks_scores_nothing(sandbox: Sandbox) -> None:
    via_globals = (
        "import os\ndef f(x):\n    g = globals()\n    for i in range(8):\n"
        "        g['__arbiter_begin__'](i)\n        g['__arbiter_pass__'](i)\n    os._exit(0)\n"
    )
    via_nonce = (
        "import gc, os\ndef f(x):\n    for o in gc.get_objects():\n"
        "        if callable(o) and getattr(o, '__name__', '') == 'say':\n"
        "            cells = [c.cell_contents for c in o.__closure__]\n"
        "            n = [c for c in cells if isinstance(c, str)][0]\n"
        "            for i in range(8):\n                os.write(3, f'{n} P {i} \\n'.encode())\n"
        "            os._exit(0)\n"
    )
    # the test code is in the job its process was forked with: it returns what they expect
    via_tests = (
        "import ast, gc\ndef f(x):\n    for o in gc.get_objects():\n"
        "        if isinstance(o, dict) and o.get('kind') == 'tests':\n"
        "            for n in ast.walk(ast.parse(o['tests'])):\n"
        "                a = n.args if isinstance(n, ast.Call) else []\n"
        "                if len(a) == 2 and isinstance(a[0], ast.Call)"
        " and ast.literal_eval(a[0].args[0]) == x:\n"
        "                    return ast.literal_eval(a[1])\n"
    )
    assert scores(sandbox, TESTS, via_globals, via_nonce, via_tests) == [0.0, 0.0, 0.0]
