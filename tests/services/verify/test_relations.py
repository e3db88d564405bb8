"""References with a relation or several parts are compared whole, never cut to a fragment;
and the notations that used to score a right answer 0 (thousands separators, times, word
answers, decimals against surds)."""

from __future__ import annotations

import httpx
import pytest

from arbiter.services.verify.scoring import score_math_direct
from arbiter.services.verify.worker import score_response

PRIMES = r"$$\boxed{2}, \boxed{3}, \boxed{5}, \boxed{7}, \boxed{13}$$"

# (answer, reference, expected score, why)
CASES: list[tuple[str, str, float, str]] = [
    # --- a fragment of a multi-part reference is not the answer
    ("5", "$x >= 5$", 0.0, "the bound of an inequality is not the inequality"),
    ("5", r"$x \geq 5$", 0.0, r"\geq likewise"),
    ("3", "$x != 3$", 0.0, "the excluded value is not the answer"),
    ("3", r"$x \neq 3$", 0.0, r"\neq likewise"),
    ("3", "$x < 3$", 0.0, "a strict bound"),
    ("3", "$x = 2, y = 3$", 0.0, "one unknown of a system"),
    ("0", "$a + 3z = 0$", 0.0, "the right-hand side of an equation"),
    ("-2", r"\boxed{1} and \boxed{-2}", 0.0, "the last of two boxed answers"),
    ("13", PRIMES, 0.0, "the last of five boxed answers"),
    ("(5, 2)", "$p=5,q=2;p=7,q=2$", 0.0, "one of two solutions"),
    # --- the whole of it is
    (r"x \geq 5", "$x >= 5$", 1.0, "the same inequality"),
    ("[5, \\infty)", r"$x \geq 5$", 1.0, "the inequality as an interval"),
    ("x \\neq 3", "$x != 3$", 1.0, "the same relation"),
    ("x = 2, y = 3", "$x = 2, y = 3$", 1.0, "the same system"),
    ("y = 3, x = 2", "$x = 2, y = 3$", 1.0, "a system in another order"),
    ("1, -2", r"\boxed{1} and \boxed{-2}", 1.0, "both answers"),
    (r"\boxed{-2} and \boxed{1}", r"\boxed{1} and \boxed{-2}", 1.0, "both, boxed"),
    ("2, 3, 5, 7, 13", PRIMES, 1.0, "the five primes"),
    ("(5,2),(7,2)", "$p=5,q=2;p=7,q=2$", 1.0, "both solutions as tuples"),
    ("5", "$x = 5$", 1.0, "an assignment's value is the answer"),
    # --- notations that scored a right answer 0
    ("$12:00$", "$12:00$", 1.0, "a time"),
    ("$1:00$", "$12:00$", 0.0, "another time"),
    ("10,\\!000", r"\boxed{10000}", 1.0, "LaTeX thousands separator"),
    ("10\\,000", "10000", 1.0, "a thin space between groups"),
    ("1 000", "1000", 1.0, "a space between groups"),
    ("odd", r"$\text{odd}$", 1.0, "a word answer"),
    (r"\text{Odd}", r"$\text{odd}$", 1.0, "a word answer, another case"),
    ("even", r"$\text{odd}$", 0.0, "another word"),
    ("dod", r"$\text{odd}$", 0.0, "the same letters are not the same word"),
    ("(C)", r"\boxed{\text{C}}", 1.0, "a choice in brackets"),
    (r"\sqrt{17}", "4.123105625617661", 1.0, "a surd against its decimal"),
    ("1.414214", r"\sqrt{2}", 1.0, "a decimal against a surd, to 6 places"),
    ("1.5", r"\sqrt{2}", 0.0, "a wrong decimal"),
    ("x = 5, y = 6", "$x = 5$", 0.0, "a system with one more unknown"),
    (r"\boxed{1}, \boxed{-2}, \boxed{5}", r"\boxed{1} and \boxed{-2}", 0.0, "one part too many"),
    ("1, 2, 3", r"\boxed{1}, \boxed{2}", 0.0, "a list with one element too many"),
    ("(3, 2)", "(2, 3)", 0.0, "a tuple is ordered"),
    (r"\{3, 2\}", r"\{2, 3\}", 1.0, "a set is not"),
    ("x > 4", "$x >= 5$", 0.0, "another inequality"),
    (r"x \le 3", r"$(-\infty, 3]$", 1.0, "an inequality answers an interval"),
    (r"x \le 3", r"$(-\infty, 3)$", 0.0, "not an open one"),
    (r"x \in (-\infty, 3)", "$x < 3$", 1.0, "a strict bound as an open interval"),
    ("e", r"\mathrm{e}", 1.0, r"\mathrm{e} is math, compared by math-verify"),
    # --- a hedge is still not an answer
    ("5 or x", "5", 0.0, "'or x' is not a unit"),
    (r"\boxed{17} or \boxed{18}", "18", 0.0, "two boxed values against one"),
    ("17, 18", "18", 0.0, "a list against one value"),
]


@pytest.mark.parametrize(("answer", "reference", "expected", "why"), CASES)
def test_whole_reference(answer: str, reference: str, expected: float, why: str) -> None:
    for response in (f"<answer>{answer}</answer>", f"The answer is \\boxed{{{answer}}}."):
        r = score_math_direct(response, reference)
        assert (r.score, r.kind) == (expected, None), f"{why}: {response!r}: {r.message}"


def test_several_boxes_against_one_value_are_a_conflict() -> None:
    result, path, answer = score_response(r"\boxed{17} or \boxed{18}", "18", 1e-6, 5)
    assert (result.score, path) == (0.0, "conflict")
    assert answer is not None and "17" in answer and "18" in answer


def test_prose_reference_is_still_invalid() -> None:
    # Prose without LaTeX (a question pasted as the reference) is not a word answer.
    r = score_math_direct("<answer>hello world</answer>", "hello world")
    assert (r.score, r.kind) == (None, "invalid_reference")


def test_whole_references_over_http(verify_url: str) -> None:
    # The same table through the running service (pool workers, fast path on): one group
    # per reference, every answer of the table for it in one request.
    by_reference: dict[str, list[tuple[str, float]]] = {}
    for answer, reference, expected, _ in CASES:
        by_reference.setdefault(reference, []).append((f"<answer>{answer}</answer>", expected))
    groups = [
        {"id": str(i), "reference": ref, "responses": [r for r, _ in rows]}
        for i, (ref, rows) in enumerate(by_reference.items())
    ]
    r = httpx.post(f"{verify_url}/v1/math", json={"groups": groups, "params": {}}, timeout=120)
    assert r.status_code == 200, r.text
    for group, rows in zip(r.json()["groups"], by_reference.values(), strict=True):
        assert group["scores"] == [e for _, e in rows], (rows, group["errors"])
