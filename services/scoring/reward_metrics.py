"""Distributions of the scores the scoring core hands out: each component's, each recipe's total.

``arbiter_gateway_component_score{component}`` and ``arbiter_gateway_reward{recipe}`` are
Prometheus histograms, but filled a whole list at a time: a scoring request carries up to
hundreds of thousands of scores, and ``prometheus_client``'s per-value ``observe`` (~0.7 µs
with a label lookup) would put most of a millisecond on the request's path. Here one
``bisect`` and two additions per value, no lock (a service process is one event loop; a scrape
runs on it too), and the families are built only when ``/metrics`` is read.

A null score is not a value and is not counted (``arbiter_gateway_component_errors_total``
counts those). The ``recipe`` label is the recipe's name; past ``MAX_RECIPES`` distinct
names (inline recipes can be named anything) the rest share the label ``other``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator

from prometheus_client.core import REGISTRY, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

# Components score in [0, 1]: tenths.
COMPONENT_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# Totals are weighted sums: a wider range. No negative bound: prometheus_client leaves out
# _count and _sum of a histogram that has one (a negative total counts in le="0.0").
REWARD_BUCKETS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 5.0)
MAX_RECIPES = 100


class _Histogram:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def add(self, values: Iterable[float | None]) -> None:
        bounds, counts = self.bounds, self.counts
        for v in values:
            if v is None or not math.isfinite(v):
                continue
            counts[bisect_left(bounds, v)] += 1  # the first bucket whose bound is >= v
            self.total += v

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out


class ScoreHistograms(Collector):
    """Both families; ``observe`` is called once per component (and once for the totals)."""

    def __init__(self) -> None:
        self.components: dict[str, _Histogram] = {}
        self.rewards: dict[str, _Histogram] = {}

    def observe_component(self, component: str, scores: Iterable[float | None]) -> None:
        hist = self.components.get(component)
        if hist is None:
            hist = self.components[component] = _Histogram(COMPONENT_BUCKETS)
        hist.add(scores)

    def observe_rewards(self, recipe: str, rewards: Iterable[float | None]) -> None:
        hist = self.rewards.get(recipe)
        if hist is None:
            if len(self.rewards) >= MAX_RECIPES:
                recipe = "other"
            hist = self.rewards.get(recipe) or _Histogram(REWARD_BUCKETS)
            self.rewards[recipe] = hist
        hist.add(rewards)

    def collect(self) -> Iterator[Metric]:
        yield _family(
            "arbiter_gateway_component_score",
            "Component scores handed out (nulls not counted), by component.",
            "component",
            self.components,
        )
        yield _family(
            "arbiter_gateway_reward",
            "Recipe totals (rewards) handed out (nulls not counted), by recipe.",
            "recipe",
            self.rewards,
        )


def _family(name: str, doc: str, label: str, hists: dict[str, _Histogram]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=[label])
    for value, hist in sorted(hists.items()):
        family.add_metric([value], hist.buckets(), hist.total)
    return family


SCORES = ScoreHistograms()
REGISTRY.register(SCORES)
