"""The one calculator behind both calculator tools: the trainer's in-process environment
(``trainer/env.py``: ``<calc>EXPR</calc>`` -> ``<result>TEXT</result>``) and the environments
service's ``calculate`` tool (``TEXT`` is its output). One grammar and one rendering, so the
policy sees the same observation for the same action whichever runs its episodes;
``tests/trainer/test_ors_episodes.py`` compares the two over ``tests/arbiter/calculator_cases.py``.

The grammar is arithmetic as a GSM8K solution writes it:

- numbers in decimal (``12``, ``0.5``, ``.5``, ``1e3``); ``,`` is a thousands separator
  between a digit and a group of exactly three (``1,200``; ``1,2`` is an error);
- ``+ - * /``, ``//`` (floor division), ``%`` (remainder, with the divisor's sign as in
  Python), ``^`` or ``**`` (power: right-associative, tighter than unary minus, so ``-2^2``
  is -4), ``x`` or ``×`` for ``*`` (always: ``0x10`` is 0), ``÷`` for ``/``, unary ``-``
  and ``+``, parentheses, spaces;
- nothing else: no names, functions or comparisons, no other character.

It is safe to hand to a policy: the text is checked character by character, then parsed by
Python's parser and walked (never ``eval``); at most 200 characters; every value is a double,
so no step builds a huge integer (``9^9^9`` overflows at once instead of running for hours).

The value renders as its digits when it is an integer below 10^15 (``3600``, never
``3600.0``), else to 10 significant digits (``2/3`` -> ``0.6666666667``, ``2^60`` ->
``1.152921505e+18``). An expression without a value renders as ``error: <reason>``.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_LENGTH = 200
SUMMARY = (
    "numbers (1,200 with thousands commas), + - * / // % ^ (or **), x or × for *, ÷ for /, "
    "and parentheses"
)
ALLOWED = frozenset("0123456789.eE+-*/%^()x×÷, \t\n")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # the comma of 1,200 (not of 1,2)
_SPELLED = str.maketrans({"x": "*", "×": "*", "÷": "/"})
_INTEGERS_UP_TO = 1e15  # doubles hold every integer below this exactly


class CalculatorError(ValueError):
    """Why an expression has no value; the message is the observation's reason."""


@dataclass(frozen=True)
class Calculation:
    text: str  # the observation: the value rendered, or "error: <reason>"
    value: float | None = None
    error: str | None = None  # the reason, when there is no value


def calculate(expression: str) -> Calculation:
    """The observation for ``expression``: its value rendered, or the reason it has none."""
    try:
        value = evaluate(expression)
    except CalculatorError as exc:
        return Calculation(f"error: {exc}", error=str(exc))
    return Calculation(render(value), value=value)


def evaluate(expression: str) -> float:
    """The expression's value; CalculatorError saying why it has none."""
    source = expression.strip()
    if not source:
        raise CalculatorError("empty expression")
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"longer than {MAX_LENGTH} characters")
    bad = next((c for c in source if c not in ALLOWED), None)
    if bad is not None:
        raise CalculatorError(f"unexpected character {bad!r}")
    source = _THOUSANDS.sub("", source).translate(_SPELLED).replace("^", "**")
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError("does not parse") from None
    try:
        return _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("number too large") from None
    except RecursionError:
        raise CalculatorError("nested too deeply") from None


def render(value: float) -> str:
    if value.is_integer() and abs(value) < _INTEGERS_UP_TO:
        return str(int(value))  # -0.0 too: "0"
    return f"{value:.10g}"


def _power(base: float, exponent: float) -> float:
    if base == 0 and exponent < 0:
        raise ZeroDivisionError
    try:
        return math.pow(base, exponent)  # a double: OverflowError, never a huge integer
    except ValueError:  # the only other domain error: a negative base
        raise CalculatorError("a negative number to a fractional power") from None


_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}


def _eval(node: ast.expr) -> float:
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        value = _BINARY[type(node.op)](_eval(node.left), _eval(node.right))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        value = -value if isinstance(node.op, ast.USub) else value
    elif isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        value = float(node.value)  # no True/False: the characters allowed cannot spell them
    else:  # what the characters allowed can still spell: 1,2  2(3)  e  ...
        raise CalculatorError("not arithmetic (numbers, operators and parentheses only)")
    if not math.isfinite(value):  # 1e308 * 10 is inf, not an OverflowError
        raise OverflowError
    return value
