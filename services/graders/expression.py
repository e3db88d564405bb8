"""``calculate_output``: an arithmetic formula over sub-graders' scores, evaluated by a walk
over Python's AST of it (never ``eval``).

What OpenAI's graders guide documents, and nothing else: the operators ``+ - * /`` and
``^`` (power; ``**`` is accepted as the same), unary ``-``/``+``, parentheses, numbers,
the sub-graders' names, and the functions ``min``, ``max``, ``abs``, ``floor``, ``ceil``,
``exp``, ``sqrt``, ``log`` (natural). ``parse`` refuses anything else when the grader is
loaded; ``evaluate`` raises ``FormulaError`` for what only the values decide (a division
by zero, ``sqrt(-1)``, an overflow), so the reward is null with ``formula_parse_error``.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping

FUNCTIONS: dict[str, Callable[..., float]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "floor": lambda x: float(math.floor(x)),
    "ceil": lambda x: float(math.ceil(x)),
    "exp": math.exp,
    "sqrt": math.sqrt,
    "log": math.log,
}
ARITY = {"abs": 1, "floor": 1, "ceil": 1, "exp": 1, "sqrt": 1, "log": 1}  # min/max: 1+
_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: math.pow(a, b),
}


class FormulaError(ValueError):
    pass


def parse(formula: str, names: frozenset[str]) -> ast.expr:
    """The formula's AST, checked: only the documented operators and functions, and
    ``names``; FormulaError saying what is not allowed."""
    try:
        # ^ is power (the guide), binding as tightly as Python's **: a formula holds no
        # strings, so the text can be rewritten before it is parsed
        source = formula.strip().replace("^", "**")
        tree = ast.parse(source, "<calculate_output>", mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise FormulaError(f"does not parse: {getattr(exc, 'msg', type(exc).__name__)}") from None
    stack: list[ast.AST] = [tree.body]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            stack += [node.left, node.right]
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            stack.append(node.operand)
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            pass
        elif isinstance(node, ast.Name):
            if node.id not in names:
                known = ", ".join(sorted(names))
                raise FormulaError(f"unknown name {node.id!r}: the graders are {known}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            fn = node.func.id
            if fn not in FUNCTIONS or node.keywords:
                raise FormulaError(f"{fn}() is not a function here: {', '.join(FUNCTIONS)}")
            want = ARITY.get(fn)
            if (want is not None and len(node.args) != want) or not node.args:
                raise FormulaError(f"{fn}() takes {want or 'one or more'} argument(s)")
            stack += node.args
        else:
            raise FormulaError(
                f"{ast.unparse(node)!r} is not allowed: + - * / ^, numbers, "
                f"the graders' names and {', '.join(FUNCTIONS)}()"
            )
    return tree.body


def evaluate(node: ast.expr, values: Mapping[str, float]) -> float:
    """The formula's value; FormulaError when the values make it undefined."""
    try:
        out = _eval(node, values)
    except (ArithmeticError, ValueError) as exc:  # ZeroDivisionError, OverflowError, domain
        raise FormulaError(f"{type(exc).__name__}: {exc}") from None
    if not math.isfinite(out):
        raise FormulaError(f"the result is {out!r}, not a finite number")
    return out


def _eval(node: ast.expr, values: Mapping[str, float]) -> float:
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_eval(node.left, values), _eval(node.right, values))
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, values)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Constant):
        assert isinstance(node.value, int | float)  # parse() let no other constant through
        return float(node.value)
    if isinstance(node, ast.Name):
        return float(values[node.id])
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    return float(FUNCTIONS[node.func.id](*(_eval(a, values) for a in node.args)))
