"""The shared calculator (``arbiter.calculator``): its grammar, its rendering, its bounds, and
the trainer's in-process environment answering with it."""

from __future__ import annotations

import time

import pytest

from arbiter.calculator import MAX_LENGTH, calculate, evaluate
from arbiter.trainer.env import CalculatorEnv
from tests.arbiter.calculator_cases import CASES


@pytest.mark.parametrize(("expression", "shown", "why"), CASES, ids=[c[2] for c in CASES])
def test_calculate(expression: str, shown: str, why: str) -> None:
    calc = calculate(expression)
    assert calc.text == shown
    assert (calc.error is None) == (calc.value is not None) == (not shown.startswith("error"))


@pytest.mark.parametrize(("expression", "shown", "why"), CASES, ids=[c[2] for c in CASES])
def test_the_in_process_environment_shows_the_same(expression: str, shown: str, why: str) -> None:
    step = CalculatorEnv().step(f"<think>so <calc>{expression}</calc>", eos=False)
    assert step.observation == f"<result>{shown}</result>"
    assert step.tool_call and step.tool_error == shown.startswith("error") and not step.done


def test_the_length_bound() -> None:
    longest = "1" + "+1" * ((MAX_LENGTH - 1) // 2)
    assert len(longest) == MAX_LENGTH - 1 and evaluate(longest) == MAX_LENGTH // 2
    assert calculate(longest + "+1").text == f"error: longer than {MAX_LENGTH} characters"
    # a longer call is no call at all in the policy's text: the episode ends
    assert CalculatorEnv().step(f"<calc>{longest}+1</calc>", eos=False).done


def test_every_bad_expression_answers_fast() -> None:
    worst = ["9" * MAX_LENGTH, "9^" * 99 + "9", "(" * 100 + ")" * 100, "-" * MAX_LENGTH]
    for expression in worst:
        start = time.perf_counter()
        calculate(expression)
        assert time.perf_counter() - start < 0.1, expression
