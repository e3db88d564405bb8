"""bench/services/math_agreement.py: each answer style writes the response it names, and the
rule scores every style right for the right value and wrong for a wrong one."""

from __future__ import annotations

import pytest

from arbiter.services.verify.scoring import score_math_direct
from bench.services import math_agreement

STEPS = "She buys 3 boxes of 6 eggs: 3 * 6 = 18."


@pytest.mark.parametrize(
    ("style", "value", "response"),
    [
        ("answer_tag", "18", f"<think>\n{STEPS}\n</think>\n<answer>18</answer>"),
        ("boxed", "18", f"{STEPS}\nSo the answer is $\\boxed{{18}}$."),
        # thousands written with LaTeX thin spaces
        ("boxed_thin_space", "12345", f"{STEPS}\nThe total is $\\boxed{{12,\\!345}}$."),
        # a fraction equal to the value
        ("fraction", "18", f"<think>{STEPS}</think>\n<answer>\\frac{{36}}{{2}}</answer>"),
        ("hashes", "18", f"{STEPS}\n#### 18"),
    ],
)
def test_a_style_writes_its_response(style: str, value: str, response: str) -> None:
    assert math_agreement.respond(style, STEPS, value) == response


def test_braces_in_the_steps_are_kept_as_written() -> None:
    assert math_agreement.respond("hashes", "a {b} c", "7") == "a {b} c\n#### 7"


@pytest.mark.parametrize("style", sorted(math_agreement.STYLES))
def test_every_style_scores_the_right_value_only(style: str) -> None:
    reference = f"{STEPS}\n#### 18"
    right = math_agreement.respond(style, STEPS, "18")
    wrong = math_agreement.respond(style, STEPS, "19")
    assert score_math_direct(right, reference).score == 1.0
    assert score_math_direct(wrong, reference).score == 0.0
