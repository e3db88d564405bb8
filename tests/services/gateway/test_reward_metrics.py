"""The score histograms: le-buckets as Prometheus defines them, nulls skipped, labels capped."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest

from arbiter.services.scoring.reward_metrics import MAX_RECIPES, ScoreHistograms


def samples(hists: ScoreHistograms) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(hists)
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_component_buckets_count_values_at_or_below_each_bound() -> None:
    hists = ScoreHistograms()
    # 0.0 is in le="0.0"; 0.1 is in le="0.1" (a bound includes itself); 1.0 in le="1.0";
    # None (could not score) and NaN are not values; 1.5 only in +Inf
    hists.observe_component("format", [0.0, 0.1, 0.55, 1.0, None, math.nan, 1.5])
    got = samples(hists)
    bucket = 'arbiter_gateway_component_score_bucket{component="format",le="%s"}'
    assert got[bucket % "0.0"] == 1
    assert got[bucket % "0.1"] == 2
    assert got[bucket % "0.5"] == 2
    assert got[bucket % "0.6"] == 3
    assert got[bucket % "1.0"] == 4
    assert got[bucket % "+Inf"] == 5
    assert got['arbiter_gateway_component_score_count{component="format"}'] == 5
    assert got['arbiter_gateway_component_score_sum{component="format"}'] == 3.15


def test_rewards_by_recipe_and_the_label_cap() -> None:
    hists = ScoreHistograms()
    hists.observe_rewards("gsm8k", [1.5, -0.2])
    for i in range(MAX_RECIPES + 5):  # inline recipes may be named anything
        hists.observe_rewards(f"inline-{i}", [1.0])
    got = samples(hists)
    assert got['arbiter_gateway_reward_count{recipe="gsm8k"}'] == 2
    assert got['arbiter_gateway_reward_bucket{le="0.0",recipe="gsm8k"}'] == 1  # -0.2 is <= 0
    assert got['arbiter_gateway_reward_sum{recipe="gsm8k"}'] == 1.3
    recipes = {k.split('recipe="')[1].split('"')[0] for k in got if "_count{" in k}
    assert len(recipes) == MAX_RECIPES + 1  # the first MAX_RECIPES names, then "other"
    assert got['arbiter_gateway_reward_count{recipe="other"}'] == 6
