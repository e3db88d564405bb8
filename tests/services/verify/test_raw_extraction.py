"""A raw response (no ``<answer>``, box, ``####`` or "answer is"): the last number when it
ends the response; else, when it writes LaTeX, the whole response as math-verify reads it.
Prices written with ``$`` are not LaTeX."""

from __future__ import annotations

import pytest

from arbiter.services.verify.scoring import score_math_direct

PRICES = "Books: $0.50/book * 8 books = $4.00\nFee: $4.00 + $2.00 = $6.00\n"

# (response, reference, expected score, why)
CASES: list[tuple[str, str, float, str]] = [
    ("$1+x$", "x+1", 1.0, "a formula alone is read whole, not as its last number 1"),
    ("So the set is $(1, \\frac{9}{2})$", "(1, 4.5)", 1.0, "a tuple at the end"),
    ("$x = 2, y = 3$", "$x = 2, y = 3$", 1.0, "a system, not its last number"),
    ("$x = 2, y = 3$", "3", 0.0, "a system is not its last number"),
    ("Therefore the result is $33$.", "33", 1.0, "a number in dollars ends the response"),
    (PRICES + "Total: **6**", "6", 1.0, "prices, then the answer"),
    (PRICES + "Total: **7**", "6", 0.0, "prices, then a wrong answer"),
    (PRICES + "So she pays 6 in the end", "6", 1.0, "prices, a number inside the last line"),
    ("40 plus 2 makes 42", "42", 1.0, "no LaTeX: the last number"),
    ("$12:00$", "$12:00$", 1.0, "a time is not a number followed by more"),
]


@pytest.mark.parametrize(("response", "reference", "expected", "why"), CASES)
def test_raw_response(response: str, reference: str, expected: float, why: str) -> None:
    r = score_math_direct(response, reference)
    assert (r.score, r.kind) == (expected, None), f"{why}: {r.message}"
