"""The scoring functions called directly (no HTTP): math_accuracy rules and format rules."""

from __future__ import annotations

import time

import pytest

from arbiter.proto.verify import FormatParams
from arbiter.services.verify.extract import answer_blocks, boxed_contents, extract_answer
from arbiter.services.verify.formatting import check_format, format_score
from arbiter.services.verify.scoring import score_math_direct
from arbiter.services.verify.worker import _gold_number, _parse_gold, score_item, score_response
from tests.services.verify.cases import FORMAT_CASES, MATH_CASES, NULL_CASES


@pytest.mark.parametrize(("response", "reference", "expected", "why"), MATH_CASES)
def test_math_table(response: str, reference: str, expected: float, why: str) -> None:
    r = score_math_direct(response, reference)
    assert (r.score, r.kind) == (expected, None), f"{why}: {r.message}"


@pytest.mark.parametrize(("response", "reference", "kind", "why"), NULL_CASES)
def test_math_null(response: str, reference: str | None, kind: str, why: str) -> None:
    r = score_math_direct(response, reference)
    assert (r.score, r.kind) == (None, kind), why


@pytest.mark.parametrize(("response", "params", "expected", "why"), FORMAT_CASES)
def test_format_table(response: str, params: dict[str, object], expected: float, why: str) -> None:
    p = FormatParams.model_validate(params)
    assert format_score(response, p) == expected, why
    # strict is exactly "all four partial checks pass"
    assert (check_format(response, p).passed == 4) == (
        format_score(response, p.model_copy(update={"mode": "strict"})) == 1.0
    )


def test_extraction_sources() -> None:
    # Which rule produced the candidate (the priority order of the README).
    assert extract_answer("x <answer> 5 </answer> \\boxed{6}").source == "answer_tag"
    assert extract_answer("\\boxed{6} #### 7").source == "boxed"
    assert extract_answer("The answer is 8\n#### 7").source == "hashes"
    assert extract_answer("A: 9 then 10").source == "answer_is"
    assert extract_answer("9 then 10").text == "10"
    assert boxed_contents("\\boxed{\\frac{1}{2}} \\boxed{3") == ["\\frac{1}{2}"]
    assert answer_blocks("<answer>a</answer><Answer>b</ANSWER>") == ["a", "b"]


ADVERSARIAL = [
    "<answer>" * 12_500,  # many opens, no close: a lazy regex would rescan each
    "\\boxed{" * 14_000,  # unbalanced boxes
    "{" * 100_000,
    "**" * 50_000,
    "The answer is " * 7_000,
    "1," * 50_000,
    "<think>" * 14_000 + "</answer>" * 10,
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_scans_are_linear(text: str) -> None:
    # Generous bound: only catastrophic (quadratic) scans could come near it.
    start = time.perf_counter()
    extract_answer(text)
    format_score(text, FormatParams(mode="partial"))
    assert time.perf_counter() - start < 2.0


def test_math_verify_own_timeout_is_a_null_timeout() -> None:
    # math-verify's own timeout (signal.alarm, 1 s here) fires inside sympy: the item is
    # null + timeout, not a silent 0.0 — unless both sides are plain numbers.
    start = time.perf_counter()
    r = score_item("5", "\\boxed{7^{123456789}}", 1e-6, 1, False)
    assert (r.score, r.kind) == (None, "timeout"), r.message
    assert time.perf_counter() - start < 10


def test_each_team_has_its_own_reference_cache() -> None:
    # A parse cache shared by all teams told one team, by the time its items took (23 vs
    # 33 ms), that another team had just used the same reference. Keyed per
    # team: team b's first use of a reference a used is a miss, parsed anew, as if a had
    # never sent it; a's own second use is a hit.
    gold = "\\frac{\\sqrt{2}}{7} + y_{cache}"
    response = "<answer>\\frac{\\sqrt{2}}{7} + y_{cache}</answer>"
    caches = (_parse_gold, _gold_number)

    def misses() -> list[int]:
        return [c.cache_info().misses for c in caches]

    score_response(response, gold, 1e-6, 5, fast=False, team="a")
    first = misses()
    score_response(response, gold, 1e-6, 5, fast=False, team="b")
    assert [m - f for m, f in zip(misses(), first, strict=True)] == [1, 1]
    again = misses()
    r = score_response(response, gold, 1e-6, 5, fast=False, team="a")
    assert misses() == again and r[0].score == 1.0
