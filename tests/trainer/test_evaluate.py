"""pass@k (the unbiased estimator) and the pairwise distance read from diversity scores."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from arbiter.services.embedding.scoring import diversity_scores
from arbiter.trainer.evaluate import ks_for, pairwise_distance, pass_at_k


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (c right) holding a right one, by counting."""
    right = set(range(c))
    subsets = list(itertools.combinations(range(n), k))
    return sum(bool(right & set(s)) for s in subsets) / len(subsets)


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [
        (16, 0, 1),  # nothing right: 0
        (16, 16, 16),  # everything right: 1
        (16, 3, 1),  # k = 1 is the plain share right
        (16, 3, 4),
        (16, 1, 16),  # one right sample among all of them: pass@n = 1
        (10, 2, 5),
        (8, 7, 2),  # fewer wrong samples than k: certain
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_is_unbiased_for_the_true_rate() -> None:
    """Averaged over many draws of n samples at success rate p, it equals 1 - (1 - p)^k."""
    rng = random.Random(0)
    p, n, k = 0.15, 16, 4
    draws = [pass_at_k(n, sum(rng.random() < p for _ in range(n)), k) for _ in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(1 - (1 - p) ** k, abs=0.01)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_ks() -> None:
    assert ks_for(16) == [1, 2, 4, 8, 16]
    assert ks_for(12) == [1, 2, 4, 8, 12]
    assert ks_for(2) == [1, 2]


@pytest.mark.parametrize("g", [2, 5, 16])
def test_pairwise_distance_from_the_services_diversity(g: int) -> None:
    """The embedding service's 1 - cos(e_i, mean) scores give the mean pairwise cosine
    distance exactly (checked against the pairs themselves)."""
    e = np.random.default_rng(g).normal(size=(g, 32))
    unit = e / np.linalg.norm(e, axis=1, keepdims=True)
    cos = unit @ unit.T
    pairs = [1 - cos[i, j] for i in range(g) for j in range(g) if i != j]
    got = pairwise_distance(list(diversity_scores(e)))
    assert got == pytest.approx(float(np.mean(pairs)), abs=1e-9)
    assert pairwise_distance(list(diversity_scores(np.ones((g, 32))))) == pytest.approx(0.0)
    assert math.isnan(pairwise_distance([0.3]))
