"""string_check's operations and text_similarity's local metrics, on known values."""

from __future__ import annotations

import pytest

from arbiter.services.graders.similarity import similarity, string_check


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
