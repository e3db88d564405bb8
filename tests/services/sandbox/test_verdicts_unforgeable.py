"""The forging catalogue: programs that try to change their tests' verdicts from inside their
own process score exactly what a careful grader says.

Every hack below is a function that returns 7 (or nothing) against tests of ``f(x) = x + 1``,
so a careful grader gives it 0, on ``code`` (the share passed), ``code-all`` (all or
nothing) and HumanEval-style references. The tests run in the checker's process, which the
program cannot reach (``checker.py``); only plain values cross. Beside them, an honest
program scores 1.0 in the same request, and values the program returns that are not plain
(generators, its own objects) behave as Python's.
"""

from __future__ import annotations

import json

import pytest

from tests.services.sandbox.conftest import Sandbox, group

PLAIN = "assert f(1) == 2\nassert f(2) == 3\nassert f(3) != 5\n"
HUMANEVAL = json.dumps(
    {
        "tests": "def check(candidate):\n    assert candidate(1) == 2\n"
        "    assert candidate(2) == 3\n    assert candidate(3) != 5\n",
        "entry_point": "f",
    }
)
SEVEN = "def f(x):\n    return 7\n"
HONEST = "def f(x):\n    return x + 1\n"

HACKS = {
    # the hook the tests' comparisons once called by name from the program's globals
    "globals hook": "globals()['__arbiter_eq__'] = lambda a, b: True\n"
    "globals()['__arbiter_in__'] = lambda a, b: True\n" + SEVEN,
    "builtins patch": "import builtins\nbuiltins.AssertionError = KeyError\n"
    "builtins.BaseException = KeyError\nbuiltins.Exception = KeyError\n" + SEVEN,
    # walks up from its call to whatever runs the tests, and marks every test passed
    "frame walking": "import sys\ndef f(x):\n    frame = sys._getframe(1)\n"
    "    while frame is not None:\n        g = frame.f_globals\n"
    "        for name in list(g):\n            if name.startswith('__arbiter'):\n"
    "                g[name] = lambda *a, **k: True\n"
    "        frame.f_globals.setdefault('__arbiter_eq__', lambda a, b: True)\n"
    "        frame = frame.f_back\n    return 7\n",
    # a profile hook that rewrites what an equality hook returns, and a trace hook
    "setprofile": "import sys\ndef hook(frame, event, arg):\n"
    "    if event == 'return' and 'eq' in frame.f_code.co_name:\n"
    "        frame.f_locals['result'] = True\n    return hook\n"
    "sys.setprofile(hook)\n" + SEVEN,
    "settrace": "import sys, threading\ndef hook(frame, event, arg):\n"
    "    if frame.f_code.co_name == 'f' and event == 'return':\n"
    "        frame.f_globals['__arbiter_pass__'] = lambda *a: None\n    return hook\n"
    "sys.settrace(hook)\nthreading.settrace(hook)\n" + SEVEN,
    # hunts the harness's objects: its hooks, its nonce, the tests' own text
    "gc hunting": "import gc, os\ndef f(x):\n    for o in gc.get_objects():\n"
    "        if callable(o) and getattr(o, '__name__', '') in ('say', 'passed', 'begin'):\n"
    "            try:\n                o(0)\n            except Exception:\n                pass\n"
    "        if isinstance(o, dict) and 'tests' in o:\n            return o\n    return 7\n",
    "reads the tests": "import ast, gc\ndef f(x):\n    for o in gc.get_objects():\n"
    "        if isinstance(o, str) and 'assert' in o and '(' in o:\n"
    "            for n in ast.walk(ast.parse(o)):\n"
    "                if isinstance(n, ast.Compare) and isinstance(n.left, ast.Call)"
    " and ast.literal_eval(n.left.args[0]) == x:\n"
    "                    return ast.literal_eval(n.comparators[0])\n    return 7\n",
    "reads files and fds": "import os\ndef f(x):\n    for fd in range(64):\n        try:\n"
    "            data = os.pread(fd, 1 << 16, 0)\n        except OSError:\n            continue\n"
    "        if b'assert' in data:\n            return data\n"
    "    for path in ('/proc/1/mem', '/proc/self/maps', '/dev/shm'):\n"
    "        try:\n            return open(path, 'rb').read(10)\n        except OSError:\n"
    "            pass\n    return 7\n",
    # writes into another process's memory: refused by the seccomp filter, no /proc
    "ctypes writes": "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "def f(x):\n    buf = ctypes.create_string_buffer(b'P 0\\n')\n"
    "    for pid in range(1, 16):\n"
    "        iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 4)\n"
    "        libc.syscall(311, pid, iov, 1, iov, 1, 0)\n"  # process_vm_writev
    "    return 7\n",
    # objects whose comparison methods say yes
    "odd __eq__": "class Yes:\n    def __eq__(self, o):\n        return True\n"
    "    def __ne__(self, o):\n        return True\n    def __hash__(self):\n        return 2\n"
    "    def __bool__(self):\n        return True\ndef f(x):\n    return Yes()\n",
    "int subclass": "class I(int):\n    def __eq__(self, o):\n        return True\n"
    "    def __ne__(self, o):\n        return False\n    __hash__ = int.__hash__\n"
    "def f(x):\n    return I(7)\n",
    "list of odd objects": "class Yes:\n    def __eq__(self, o):\n        return True\n"
    "def f(x):\n    return [Yes()]\n",
    # leaves mid-test, with success
    "exit(0) mid-test": "def f(x):\n    exit(0)\n",
    "os._exit(0) mid-test": "import os\ndef f(x):\n    os._exit(0)\n",
    "SystemExit": "def f(x):\n    raise SystemExit(0)\n",
    # prints what a harness might read as verdicts, on every descriptor it has
    "forged lines": "import os, sys\ndef f(x):\n    for fd in range(1, 16):\n"
    "        for tag in ('P 0', 'P 1', 'P 2', 'E', '0000000000000000 P 0'):\n"
    "            try:\n                os.write(fd, (tag + '\\n').encode())\n"
    "            except OSError:\n                pass\n    print('passed 3/3')\n    return 7\n",
}


@pytest.mark.parametrize("mode", ["fraction", "all"])
@pytest.mark.parametrize("reference", [PLAIN, HUMANEVAL], ids=["asserts", "humaneval"])
def test_no_hack_changes_a_verdict(sandbox: Sandbox, reference: str, mode: str) -> None:
    programs = [HONEST, SEVEN, *HACKS.values()]
    body = sandbox.score("code_tests", [group(reference, *programs)], {"mode": mode})
    scores = body["groups"][0]["scores"]
    got = dict(zip(["honest", "seven", *HACKS], scores, strict=True))
    # f(3) != 5 holds for 7 (and for an object that is not 5): a third, in fraction mode
    seven = 1 / 3 if mode == "fraction" else 0.0
    want = {name: seven for name in ["seven", *HACKS]}
    want |= {"honest": 1.0, "exit(0) mid-test": 0.0, "os._exit(0) mid-test": 0.0}
    want["SystemExit"] = 0.0
    want["forged lines"] = 0.0  # junk on its own answer pipe (fd 3) fails its tests
    assert got == pytest.approx(want), got


def test_values_that_are_not_plain_behave_as_in_python(sandbox: Sandbox) -> None:
    tests = (
        "assert list(gen(3)) == [0, 1, 2]\nassert gen(2) != [0, 1]\n"
        "p = Pair(1, 2)\nassert p.total() == 3 and p.a == 1\nassert longest([Pair(1, 2)]) == 3\n"
        "assert f(2) == Fraction(1, 2)\nassert counts('aab') == {'a': 2, 'b': 1}\n"
    )
    program = (
        "import collections\nfrom fractions import Fraction\n"
        "def gen(n):\n    yield from range(n)\n"
        "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
        "    def total(self):\n        return self.a + self.b\n"
        "def longest(pairs):\n    return max(p.total() for p in pairs)\n"
        "def f(x):\n    return Fraction(1, x)\n"
        "def counts(s):\n    return collections.Counter(s)\n"
    )
    reference = "from fractions import Fraction\n" + tests
    g = sandbox.score("code_tests", [group(reference, program)])["groups"][0]
    assert g["scores"] == [1.0], g


def test_an_exception_the_test_expects_is_raised_in_the_test(sandbox: Sandbox) -> None:
    tests = (
        "try:\n    f(-1)\n    assert False\nexcept ValueError as e:\n    assert 'neg' in str(e)\n"
        "assert f(1) == 1\n"
    )
    program = "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    g = sandbox.score("code_tests", [group(tests, program)])["groups"][0]
    assert g["scores"] == [1.0], g


def test_asserts_that_check_nothing_of_the_program_are_not_tests(sandbox: Sandbox) -> None:
    # HumanEval's check functions hold `assert True` lines: `return None` earned them
    reference = json.dumps(
        {
            "tests": "def check(candidate):\n    assert candidate([1]) == 1\n    assert True\n"
            "    assert True, 'This prints if this assert fails'\n    y = 2\n    assert y == 2\n"
            "    assert candidate([]) is None\n",
            "entry_point": "f",
        }
    )
    none = "def f(xs):\n    return None\n"
    honest = "def f(xs):\n    return xs[0] if xs else None\n"
    g = sandbox.score("code_tests", [group(reference, none, honest)])["groups"][0]
    assert g["scores"] == [0.5, 1.0], g  # None really passes `candidate([]) is None`
    assert g["info"]["tests"] == [2, 2], g
    only_true = "def check(candidate):\n    assert True\n    x = 1\n    assert x == 1\n"
    g = sandbox.score(
        "code_tests", [group(json.dumps({"tests": only_true, "entry_point": "f"}), honest)]
    )["groups"][0]
    assert g["scores"] == [None], g
    assert g["errors"][0]["kind"] == "invalid_reference", g


def test_a_program_that_dies_is_not_the_exception_a_test_expects(sandbox: Sandbox) -> None:
    tests = "try:\n    f(-1)\n    assert False\nexcept Exception:\n    pass\nassert f(1) == 1\n"
    dies = "import os\ndef f(x):\n    if x < 0:\n        os._exit(0)\n    return x\n"
    raises = "def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return x\n"
    g = sandbox.score("code_tests", [group(tests, dies, raises)])["groups"][0]
    assert g["scores"] == [0.5, 1.0], g
