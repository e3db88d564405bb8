"""string_check's operations and text_similarity's local metrics: known values, rouge-score's
own numbers, and the length limit that bounds what one pair costs the gateway."""

from __future__ import annotations

import random

import pytest

from arbiter.proto.graders import TextSimilarityGrader
from arbiter.services.graders.engine import Row, grade
from arbiter.services.graders.similarity import MAX_CHARS, similarity, string_check
from arbiter.services.sandbox.grader import sample


@pytest.mark.parametrize(
    ("operation", "text", "reference", "score"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "paris", "Paris", 0.0),  # case counts
        ("ne", "Lyon", "Paris", 1.0),
        ("like", "It is Paris.", "Paris", 1.0),  # the reference inside the input
        ("like", "It is paris.", "Paris", 0.0),
        ("ilike", "IT IS PARIS.", "paris", 1.0),  # any case
        ("ilike", "Lyon", "paris", 0.0),
    ],
)
def test_string_check(operation: str, text: str, reference: str, score: float) -> None:
    assert string_check(operation, text, reference) == score


@pytest.mark.parametrize(
    ("metric", "text", "reference", "score"),
    [
        # rapidfuzz's ratio: 91 on fuzzywuzzy's README example
        ("fuzzy_match", "fuzzy wuzzy was a bear", "wuzzy fuzzy was a bear", 0.9090909),
        ("fuzzy_match", "same", "same", 1.0),
        ("bleu", "the cat sat on the mat", "the cat sat on the mat", 1.0),
        ("gleu", "the cat sat on the mat", "the cat is on the mat", 0.5),
        # rouge-score F-measure: 5 of 6 unigrams shared both ways
        ("rouge_1", "the cat sat on the mat", "the cat is on the mat", 0.8333333),
        ("rouge_2", "the cat sat on the mat", "the cat is on the mat", 0.6),
        ("rouge_5", "the cat sat on the mat", "the cat is on the mat", 0.0),
        ("rouge_l", "the cat sat on the mat", "the cat is on the mat", 0.8333333),
        ("bleu", "", "", 1.0),  # nothing against nothing
        ("bleu", "", "text", 0.0),
    ],
)
def test_metrics(metric: str, text: str, reference: str, score: float) -> None:
    assert similarity(metric, text, reference) == pytest.approx(score, abs=1e-6)


def test_bleu_of_a_close_short_answer_is_above_zero() -> None:
    """Smoothed: a short answer sharing most n-grams is not 0 for lack of one 4-gram."""
    assert 0.0 < similarity("bleu", "the cat sat", "the cat sat down") < 1.0


def test_rouge_l_is_rouge_scores_own_number() -> None:
    """rouge_l's LCS comes from rapidfuzz; the F-measure must be rouge-score's, exactly."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    rng = random.Random(7)
    words = ["the", "Cat", "sat", "on", "mat", "2,", "x-y", "über", "cats", "a"]
    for _ in range(500):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 25)))
        reference = " ".join(rng.choice(words) for _ in range(rng.randint(0, 25)))
        want = scorer.score(reference, text)["rougeL"].fmeasure
        assert similarity("rouge_l", text, reference) == pytest.approx(want, abs=1e-12)


async def test_a_side_over_the_length_limit_is_null_naming_the_limit() -> None:
    grader = TextSimilarityGrader.model_validate(
        {"type": "text_similarity", "name": "close", "evaluation_metric": "rouge_l",
         "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}"}
    )  # fmt: skip
    long = "word " * (MAX_CHARS // 5 + 1)
    rows = [Row(sample(text), {"answer": "a word"}, 0) for text in ("a word", long)]
    short, over = await grade(grader, rows, backend=None)  # type: ignore[arg-type]
    assert short.score == 1.0
    assert over.score is None and over.kind == "grader_error"
    assert f"{MAX_CHARS:,}" in over.message and "input" in over.message
