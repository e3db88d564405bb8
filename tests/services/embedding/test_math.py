"""Diversity math, rescaling and forward-pass planning, on given vectors (no model)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from arbiter.services.embedding.encoder import plan_chunks
from arbiter.services.embedding.scoring import diversity_scores, normalize_scores


def reference_diversity(vectors: np.ndarray) -> np.ndarray:
    """Straight from the definition: 1 − cos(e_i, m), e_i unit, m their mean."""
    e = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    m = e.mean(axis=0)
    return np.array([1.0 - float(v @ m) / (np.linalg.norm(v) * np.linalg.norm(m)) for v in e])


RNG = np.random.default_rng(0)

CASES = [
    # orthonormal basis: every e_i is at the same angle to m, cos = 1/√3
    (np.eye(3), np.full(3, 1.0 - 1.0 / math.sqrt(3.0))),
    # lengths do not matter: the same directions scaled
    (np.eye(3) * np.array([[2.0], [0.5], [7.0]]), np.full(3, 1.0 - 1.0 / math.sqrt(3.0))),
    # two vectors 90° apart: each is 45° from the mean, 1 − cos 45°
    (np.array([[1.0, 0.0], [0.0, 1.0]]), np.full(2, 1.0 - math.sqrt(0.5))),
    # identical vectors: no diversity at all
    (np.tile([[0.3, -1.2, 4.0]], (4, 1)), np.zeros(4)),
    # one outlier among three identical: the outlier is the most diverse
    (np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), None),
    # random 384-d vectors, as an embedder would give
    (RNG.normal(size=(8, 384)), None),
]


@pytest.mark.parametrize(("vectors", "expected"), CASES)
def test_diversity_matches_numpy(vectors: np.ndarray, expected: np.ndarray | None) -> None:
    got = diversity_scores(vectors)
    np.testing.assert_allclose(got, reference_diversity(vectors), atol=1e-12)
    if expected is not None:
        np.testing.assert_allclose(got, expected, atol=1e-12)
    assert np.all(got >= 0.0) and np.all(got <= 2.0)


def test_outlier_scores_highest() -> None:
    got = diversity_scores(np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    assert int(np.argmax(got)) == 3
    assert got[0] == pytest.approx(got[1]) == pytest.approx(got[2])


def test_mean_zero_gives_one() -> None:
    # opposite directions cancel: cos with the zero vector is taken as 0 (documented rule)
    np.testing.assert_array_equal(diversity_scores(np.array([[1.0, 0.0], [-1.0, 0.0]])), [1, 1])


NORMALIZE_CASES = [
    # none: values unchanged
    ("none", [0.1, 0.2, 0.4], [0.1, 0.2, 0.4]),
    # minmax: min → 0, max → 1, linear between
    ("group_minmax", [0.1, 0.2, 0.4], [0.0, 1.0 / 3.0, 1.0]),
    # minmax of equal values: all 0, not NaN
    ("group_minmax", [0.25, 0.25, 0.25], [0.0, 0.0, 0.0]),
    # zscore with the population std: mean 0.2, std √(0.02/3)
    ("group_zscore", [0.1, 0.2, 0.3], [-math.sqrt(1.5), 0.0, math.sqrt(1.5)]),
    # zscore of equal values: all 0, not NaN
    ("group_zscore", [0.5, 0.5], [0.0, 0.0]),
    # float noise below 1e-9 counts as equal (identical responses)
    ("group_zscore", [1e-16, 0.0, 2e-16], [0.0, 0.0, 0.0]),
]


@pytest.mark.parametrize(("mode", "values", "expected"), NORMALIZE_CASES)
def test_normalize(mode: str, values: list[float], expected: list[float]) -> None:
    got = normalize_scores(np.array(values), mode)  # type: ignore[arg-type]
    np.testing.assert_allclose(got, expected, atol=1e-12)


PLAN_CASES = [
    # (lengths, batch_size, max_batch_tokens): every text once, longest first, both limits kept
    ([5, 100, 7, 64, 3, 90], 2, 10_000),
    ([5, 100, 7, 64, 3, 90], 64, 200),  # token budget binds: 100 × 2 = 200
    ([300], 8, 100),  # one text over the budget still forms its own pass
    ([10] * 50, 16, 1_000_000),
]


@pytest.mark.parametrize(("lengths", "batch_size", "budget"), PLAN_CASES)
def test_plan_chunks(lengths: list[int], batch_size: int, budget: int) -> None:
    arr = np.array(lengths)
    chunks = plan_chunks(arr, batch_size, budget)
    flat = np.concatenate(chunks)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert list(arr[flat]) == sorted(lengths, reverse=True)
    for idx in chunks:
        assert len(idx) <= batch_size
        assert len(idx) == 1 or len(idx) * arr[idx].max() <= budget
