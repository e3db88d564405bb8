"""NeMo Gym's ``/aggregate_metrics``: ``nemo_gym.reward_profile.compute_aggregate_metrics``
(NeMo Gym 0.7.0) for a resources server that overrides none of its hooks, without pandas.

NeMo Gym posts a run's verify responses, each stamped with ``_ng_task_index`` and
``_ng_rollout_index``, and logs what comes back as it is:

- ``group_level_metrics``, per task: ``mean/``, ``max/``, ``min/``, ``median/`` and ``std/``
  (sample) of every numeric field (a bool as 0 or 1; the response's ``usage`` too), and the
  task's rollouts (``rollout_infos``);
- ``agent_metrics``: the same over every rollout; with several rollouts per task, each
  ``mean/*`` again across repeats (``mean_across_repeats/mean/reward``…, with its standard
  error and 95 % Student-t interval); ``num_repeats``;
- ``key_metrics``: agent_metrics' ``mean/*``;
- ``repeat_level_metrics``: per rollout index, when there are several (with ``sem/``,
  ``p25/``, ``p75/`` and the interval);
- ``perf_summary``: from the rollouts' ``ng_perf``, when any has one.

A ``mask_sample: true`` response (its reward could not be computed) enters no quality number;
``coverage/*`` counts it. A statistic over no values is left out, never 0; a one-value
standard deviation is 0 only where every column has one value (pandas' rule there).
``tests/services/gateway/nemo_gym_checks.py`` checks the numbers against NeMo
Gym's own function.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from arbiter.errors import BadRequest
from arbiter.proto.nemo_gym import NemoGymAggregateMetrics

TASK = "_ng_task_index"
ROLLOUT = "_ng_rollout_index"
MASK = "mask_sample"
ACROSS = "_across_repeats/"
Row = dict[str, Any]
Numbers = dict[str, float]
# Not point estimates: left out across repeats (NeMo Gym's metrics_config.is_primary_metric).
NOT_PRIMARY_NAMES = (
    TASK,
    ROLLOUT,
    "_ng_attempt_index",
    "sample_count",
    "missing_count",
    "num_repeats",
    "token_usage_version",
)
NOT_PRIMARY_PREFIXES = (
    "max/",
    "min/",
    "median/",
    "std/",
    "sem/",
    "se/",
    "p25/",
    "p75/",
    "ci_low_95/",
    "ci_high_95/",
    "histogram/",
)
NOT_PRIMARY_SUFFIXES = (
    "/max",
    "/min",
    "/median",
    "/p5",
    "/p25",
    "/p75",
    "/p95",
    "/ci_low_95",
    "/ci_high_95",
    "/ci_lower",
    "/ci_upper",
    "_ci_lower",
    "_ci_upper",
    "_ci95_lower",
    "_ci95_upper",
    "/_ng_attempt_index",
    "/std_dev_across_runs",
    "/std_err_across_runs",
    "/avg_sample_std_dev",
)
PERF_TOKENS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "reasoning_tokens")


def aggregate(responses: list[Row]) -> NemoGymAggregateMetrics:
    """``AggregateMetrics`` of a run's verify responses (the module docstring)."""
    if not responses:
        return NemoGymAggregateMetrics()
    scored = [r for r in responses if not r.get(MASK)]
    masked = [r for r in responses if r.get(MASK)]
    cover = coverage(responses, scored, masked)
    ng_perf = [r["ng_perf"] for r in responses if isinstance(r.get("ng_perf"), dict)]
    perf = perf_summary(ng_perf, len(responses))
    if not scored:  # nothing was measured: coverage, and no quality number at all
        return NemoGymAggregateMetrics(
            agent_metrics=cover, key_metrics=dict(cover), perf_summary=perf
        )
    by_key = measured(scored, {key(r) for r in masked})
    columns = list(dict.fromkeys(c for _, nums in by_key.values() for c in nums))
    by_task: dict[int, list[tuple[Row, Numbers]]] = {}
    for (task, _), found in sorted(by_key.items()):
        by_task.setdefault(task, []).append(found)
    groups = [
        {
            TASK: task,
            **describe([nums for _, nums in found], columns),
            "sample": {"agent_ref": {"name": "agent"}},
            "num_rollouts": len(found),
            "expected_num_rollouts": len(found),
            "missing_num_rollouts": 0,
            "reward_profile_completion_pct": 100.0,
            "rollout_infos": [rollout_info(result) for result, _ in found],
        }
        for task, found in by_task.items()
    ]
    repeats = repeat_level(by_key, columns)
    agent: Row = {**describe([n for _, n in by_key.values()], columns), **across(repeats)}
    agent.update(cover)
    agent["num_repeats"] = len({r.get(ROLLOUT, 0) for r in responses})
    key_metrics = {k: v for k, v in agent.items() if k.startswith("mean/")} | cover
    return NemoGymAggregateMetrics(
        group_level_metrics=groups,
        agent_metrics=agent,
        key_metrics=key_metrics,
        perf_summary=perf,
        repeat_level_metrics=repeats,
    )


def key(response: Row) -> tuple[int, int]:
    task, rollout = response.get(TASK, 0), response.get(ROLLOUT, 0)
    for name, value in ((TASK, task), (ROLLOUT, rollout)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadRequest(f"verify_responses: {name} must be an integer", param=name)
    return task, rollout


Measured = dict[tuple[int, int], tuple[Row, Numbers]]


def measured(scored: list[Row], masked: set[tuple[int, int]]) -> Measured:
    """The measured responses by (task, rollout), each with its numeric fields."""
    out: Measured = {}
    for response in scored:
        k = key(response)
        if k in out or k in masked:  # NeMo Gym's rollout alignment refuses it too
            raise BadRequest(
                f"verify_responses: two responses for task {k[0]}, rollout {k[1]} "
                f"({TASK}, {ROLLOUT})",
                param="verify_responses",
            )
        result = {n: v for n, v in response.items() if n != MASK}
        out[k] = (result, numbers(result | usage(result)))
    return out


def usage(result: Row) -> Row:
    response = result.get("response")
    found = response.get("usage") if isinstance(response, dict) else None
    return found if isinstance(found, dict) else {}


def numbers(fields: Row, skip: tuple[str, ...] = ()) -> Numbers:
    """The numeric fields (a bool as 0 or 1) but NeMo Gym's own (``_*``) and ``skip``."""
    out: Numbers = {}
    for name, value in fields.items():
        if name.startswith("_") or name in skip:
            continue
        if isinstance(value, bool):
            out[name] = int(value)
        elif isinstance(value, int | float) and not math.isnan(value):
            out[name] = value
    return out


def rollout_info(result: Row) -> Row:
    task, rollout = key(result)
    info: Row = {"rollout_id": f"{task}:{rollout}", TASK: task, ROLLOUT: rollout}
    if "reward" in result:
        info["reward"] = result["reward"]
    return info | numbers(usage(result)) | numbers(result, skip=("reward", "response"))


def describe(rows: list[Numbers], columns: list[str]) -> Numbers:
    """mean, max, min, median and sample std of each column over ``rows``."""
    out: dict[str, dict[str, float]] = {s: {} for s in ("mean", "max", "min", "median", "std")}
    for c in columns:
        values = [row[c] for row in rows if c in row]
        if not values:
            continue
        out["mean"][c] = mean(values)
        out["max"][c], out["min"][c] = max(values), min(values)
        out["median"][c] = statistics.median(values)
        if len(values) > 1:
            out["std"][c] = sample_std(values)
    if not out["std"]:  # pandas: then 0 for each column that has a value in every row
        out["std"] = {c: 0.0 for c in columns if all(c in row for row in rows)}
    return {f"{s}/{c}": v for s, by_column in out.items() for c, v in by_column.items()}


def repeat_level(by_key: Measured, columns: list[str]) -> list[Row]:
    """Per rollout index, over the tasks: only when there are several rollout indices."""
    by_rollout: dict[int, list[tuple[int, Numbers]]] = {}
    for (task, rollout), (_, nums) in sorted(by_key.items(), key=lambda kv: kv[0][::-1]):
        by_rollout.setdefault(rollout, []).append((task, nums))
    if len(by_rollout) < 2:
        return []
    tasks = len({t for t, _ in by_key})
    out = []
    for rollout, found in by_rollout.items():
        present = len({t for t, _ in found})
        entry: Row = {ROLLOUT: rollout, "sample_count": present, "missing_count": tasks - present}
        for c in sorted(columns):
            values = [nums[c] for _, nums in found if c in nums]
            if not values:
                continue
            m, n = mean(values), len(values)
            std = sample_std(values) if n > 1 else 0.0
            entry |= {f"mean/{c}": m, f"median/{c}": float(statistics.median(values))}
            entry |= {f"std/{c}": std, f"sem/{c}": std / n**0.5}
            entry |= {f"min/{c}": float(min(values)), f"max/{c}": float(max(values))}
            entry |= {f"p25/{c}": quantile(values, 0.25), f"p75/{c}": quantile(values, 0.75)}
            if ci := interval(m, std / n**0.5, n):
                entry[f"ci_low_95/{c}"], entry[f"ci_high_95/{c}"] = ci
        out.append(entry)
    return out


def across(repeats: list[Row]) -> Row:
    """Each point estimate of the repeats (``mean/*``), summarised across them."""
    out: Row = {}
    names = dict.fromkeys(n for entry in repeats for n in entry if primary(n))
    for name in names:
        values = [e[name] for e in repeats if name in e]
        m, n = mean(values), len(values)
        std = sample_std(values) if n > 1 else 0.0
        se = std / n**0.5
        stats = {"mean": m, "median": float(statistics.median(values)), "std": std}
        stats |= {"min": float(min(values)), "max": float(max(values)), "se": se}
        if ci := interval(m, se, n):
            stats["ci_low_95"], stats["ci_high_95"] = ci
        out |= {f"{stat}{ACROSS}{name}": v for stat, v in stats.items()}
    return out


def primary(name: str) -> bool:
    return not (
        name in NOT_PRIMARY_NAMES
        or name.startswith(NOT_PRIMARY_PREFIXES)
        or name.endswith(NOT_PRIMARY_SUFFIXES)
        or ACROSS in name
    )


def coverage(every: list[Row], scored: list[Row], masked: list[Row]) -> Row:
    """How much of the run the quality numbers cover; nothing when nothing was masked."""
    if not masked:
        return {}
    tasks, measured_tasks = {r.get(TASK, 0) for r in every}, {r.get(TASK, 0) for r in scored}
    return {
        "coverage/measured_rollouts": len(scored),
        "coverage/masked_rollouts": len(masked),
        "coverage/measured_tasks": len(measured_tasks),
        "coverage/fully_masked_tasks": len(tasks - measured_tasks),
    }


def perf_summary(records: list[Row], total: int) -> Row | None:
    """``perf_summary`` of the rollouts' ``ng_perf`` records (``compute_perf_summary``)."""
    if total <= 0 or not records:
        return None

    def values(name: str) -> list[float]:
        return [r[name] for r in records if isinstance(r.get(name), int | float)]

    covered = [r.get("token_observability_coverage") for r in records]
    out: Row = {
        "overall_observability_coverage": len(records) / total,
        "token_observability_coverage": sum(
            1 for c in covered if isinstance(c, int | float) and c > 0
        )
        / total,
    }
    for name in PERF_TOKENS:
        if found := values(name):
            out |= {f"{s}_{name}": STATS[s](found) for s in ("mean", "median", "total")}
    if turns := values("num_turns"):
        out |= {f"{s}_num_turns": STATS[s](turns) for s in ("mean", "median", "std", "min")}
        out |= {"p90_num_turns": quantile(turns, 0.9), "max_num_turns": max(turns)}
    per_turn = [
        r["completion_tokens"] / r["num_turns"]
        for r in records
        if isinstance(r.get("completion_tokens"), int | float)
        and isinstance(r.get("num_turns"), int | float)
        and r["num_turns"] > 0
    ]
    if per_turn:
        out["mean_tokens_per_turn"] = statistics.fmean(per_turn)
        out["median_tokens_per_turn"] = statistics.median(per_turn)
    if latency := values("total_latency_ms"):
        for p in (50, 90, 99):
            out[f"total_latency_p{p}_ms"] = quantile(latency, p / 100)
        out["total_latency_mean_ms"] = statistics.fmean(latency)
    return out


STATS: dict[str, Callable[[list[float]], float]] = {
    "mean": statistics.fmean,
    "median": statistics.median,
    "total": sum,
    "std": statistics.pstdev,
    "min": min,
}


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def sample_std(values: list[float]) -> float:
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile, linear between the closest ranks (pandas' and numpy's default)."""
    ranked = sorted(values)
    at = (len(ranked) - 1) * q
    low = math.floor(at)
    high = min(low + 1, len(ranked) - 1)
    return float(ranked[low] + (ranked[high] - ranked[low]) * (at - low))


def interval(m: float, se: float, n: int) -> tuple[float, float] | None:
    """The 95 % Student-t interval of a mean over ``n`` values; a point when ``se`` is 0."""
    if n <= 1:
        return None
    if se == 0:
        return m, m
    half = t_975(n - 1) * se
    return m - half, m + half


@lru_cache(maxsize=1024)
def t_975(df: int) -> float:
    """Student's t 97.5 % quantile with ``df`` degrees of freedom (scipy's ``t.ppf``):
    ``t = sqrt(df (1 - x) / x)`` where ``I_x(df/2, 1/2) = 0.05``, found by bisection on x."""
    low, high = 0.0, 1.0
    for _ in range(100):
        x = (low + high) / 2
        low, high = (x, high) if beta_inc(df / 2, 0.5, x) < 0.05 else (low, x)
    x = (low + high) / 2
    return math.sqrt(df * (1 - x) / x)


def beta_inc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)`` (a continued fraction,
    Numerical Recipes' ``betai``)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(log_front + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return h
