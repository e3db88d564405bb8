"""calculate_output: OpenAI's documented operators and functions, nothing else."""

from __future__ import annotations

import pytest

from arbiter.services.graders.expression import FormulaError, evaluate, parse

NAMES = frozenset({"a", "b"})
VALUES = {"a": 1.0, "b": 0.5}


@pytest.mark.parametrize(
    ("formula", "value"),
    [
        ("0.5 * a + 0.5 * b", 0.75),  # the guide's weighted sum
        ("a - b / 2", 0.75),  # / before -
        ("b ^ 2", 0.25),  # ^ is power
        ("2 * b ^ 2", 0.5),  # ^ binds tighter than * (it is not Python's xor)
        ("-a + +b", -0.5),  # unary signs
        ("min(a, b) + max(a, b, 3)", 3.5),  # min/max of any count
        ("abs(b - a) + floor(1.7) + ceil(0.2)", 2.5),
        ("exp(0) + sqrt(4) + log(1)", 3.0),
        ("(a + b) * 2", 3.0),  # parentheses
    ],
)
def test_formulas_evaluate(formula: str, value: float) -> None:
    assert evaluate(parse(formula, NAMES), VALUES) == pytest.approx(value)


@pytest.mark.parametrize(
    ("formula", "words"),
    [
        ("a + c", "unknown name 'c'"),  # not a sub-grader
        ("__import__('os')", "__import__() is not a function"),  # no builtins
        ("a.__class__", "not allowed"),  # no attributes
        ("a if b else 0", "not allowed"),  # no conditionals
        ("[a][0]", "not allowed"),  # no containers
        ("'a' * 3", "not allowed"),  # no strings
        ("True + a", "not allowed"),  # no booleans
        ("sqrt(a, b)", "takes 1"),  # arity
        ("min()", "one or more"),
        ("max(a, key=b)", "not a function"),  # no keywords
        ("a +", "does not parse"),
    ],
)
def test_anything_else_is_refused_before_it_runs(formula: str, words: str) -> None:
    with pytest.raises(FormulaError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse(formula, NAMES)


@pytest.mark.parametrize("formula", ["a / (b - 0.5)", "sqrt(b - a)", "log(0 * a)", "exp(1000)"])
def test_values_that_make_the_formula_undefined_are_a_formula_error(formula: str) -> None:
    with pytest.raises(FormulaError):
        evaluate(parse(formula, NAMES), VALUES)
