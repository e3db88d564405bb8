"""The calculator environment (its grammar: ``tests/arbiter/test_calculator.py``)."""

from __future__ import annotations

import pytest

from arbiter.trainer.data import Problem, reference_of
from arbiter.trainer.env import CalculatorEnv

PROBLEM = Problem(id="p", question="What is 12 times 7?", reference="84")


@pytest.mark.parametrize(
    ("action", "eos", "observation", "done"),
    [
        # a tool call ends the action: the result comes back, the episode goes on
        ("<think>12 times 7 is <calc>12*7</calc>", False, "<result>84</result>", False),
        # GSM8K-style operators and thousands separators
        ("<calc>1,000 x 3 ÷ 4</calc>", False, "<result>750</result>", False),
        # non-integer results keep 10 significant digits
        ("<calc>2/3</calc>", False, "<result>0.6666666667</result>", False),
        # anything but arithmetic is an error result with its reason, not an exception
        (
            "<calc>__import__('os')</calc>",
            False,
            "<result>error: unexpected character '_'</result>",
            False,
        ),
        ("<calc>1/0</calc>", False, "<result>error: division by zero</result>", False),
        ("<calc>9**999999</calc>", False, "<result>error: number too large</result>", False),
        # EOS or no tool call: the episode is over
        ("<think>84</think><answer>84</answer>", True, "", True),
        ("no call here", False, "", True),
    ],
)
def test_calculator_step(action: str, eos: bool, observation: str, done: bool) -> None:
    env = CalculatorEnv()
    assert "<calc>" in env.reset(PROBLEM) and PROBLEM.question in env.reset(PROBLEM)
    step = env.step(action, eos=eos)
    assert (step.observation, step.done) == (observation, done)


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", "72"),  # GSM8K answer field
        ("#### 1,000", "1000"),  # thousands separators dropped
        ("18", "18"),  # a bare value
    ],
)
def test_reference_of(answer: str, reference: str) -> None:
    assert reference_of(answer) == reference
