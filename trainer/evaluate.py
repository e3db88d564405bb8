"""Held-out evaluation: greedy completions, accuracy from the gateway (verify's math_accuracy).

Problems are sharded over ranks; sums are all-reduced so every rank gets the same numbers.
With ``eval_samples`` = N > 0 the same problems are also sampled N times each at the rollout
temperature and scored as groups of N: ``eval/pass@k`` for k = 1, 2, 4, ... <= N (the
unbiased estimator below, averaged over problems), and, when ``eval_recipe`` has the
``diversity`` component, ``eval/pairwise_distance``: the mean cosine distance between two
samples of one problem, averaged over problems (what collapse drives to 0).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import torch

from arbiter.proto.gateway import ScoreGroup
from arbiter.trainer.env import rollout_batch
from arbiter.trainer.parallel import gathered

if TYPE_CHECKING:
    from arbiter.trainer.data import Problem
    from arbiter.trainer.run import Run


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n, c of them right, is
    right) = 1 - C(n-c, k) / C(n, k): the unbiased estimator of pass@k from n >= k samples
    (Chen et al. 2021), as a stable product."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pairwise_distance(diversities: list[float]) -> float:
    """Mean cosine distance over pairs of a group's samples, from its diversity scores
    d_i = 1 - cos(e_i, m) (m: the mean of the unit embeddings): mean_i cos(e_i, m) = |m|, and
    the sum of all pairwise cosines is G^2 |m|^2, so the mean over the G(G-1) ordered pairs
    i != j is (G |m|^2 - 1) / (G - 1)."""
    g = len(diversities)
    if g < 2:
        return math.nan
    m = 1.0 - sum(diversities) / g
    return 1.0 - (g * m * m - 1.0) / (g - 1)


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [k for k in (2**i for i in range(n.bit_length())) if k <= n]
    return ks + ([n] if ks[-1] != n else [])


@torch.no_grad()
def evaluate(run: Run) -> dict[str, float]:
    cfg, dist, tokenizer, problems = run.cfg, run.dist, run.tokenizer, run.eval_problems
    mine = problems[dist.rank :: dist.world]
    spec, params = run.eval_sampling()
    texts: list[str] = []
    chunk = max(1, cfg.rollouts_per_step)
    with gathered(run.policy):  # every rank enters once, however many problems it has
        for s in range(0, len(mine), chunk):
            batch = mine[s : s + chunk]
            texts.extend(rollout_batch(run.sampler, tokenizer, batch, spec, params, run.ors).texts)
    sums: dict[str, list[float]] = {}
    if mine:
        groups = [
            ScoreGroup(id=p.id, prompt=p.question, reference=p.reference, responses=[t])
            for p, t in zip(mine, texts, strict=True)
        ]
        result = run.rewards.score(cfg.eval_recipe, groups)
        for name in ["reward", *result.component_names()]:
            vals = result.flat() if name == "reward" else result.flat_component(name)
            ok = [v for v in vals if not math.isnan(v)]
            sums[name] = [sum(ok), float(len(ok)), float(len(vals) - len(ok))]
    if cfg.eval_samples:
        sums |= _sampled(run, mine)
    names = sorted(sums)
    # every rank must reduce the same keys: the eval recipe is the same on all ranks
    flat = dist.all_sum([x for n in names for x in sums[n]], run.device)
    out: dict[str, float] = {}
    for i, n in enumerate(names):
        total, count, nulls = flat[3 * i : 3 * i + 3]
        out[f"eval/{n}"] = total / count if count else math.nan
        if not n.startswith(("pass@", "pairwise_")):
            out[f"eval/{n}/null"] = nulls
    lens = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    out["eval/completion_len"] = sum(lens) / max(1, len(lens))
    # accuracy: the math_accuracy component when the eval recipe has it, else the reward
    out["eval/accuracy"] = out.get("eval/math_accuracy", out.get("eval/reward", math.nan))
    out["eval/problems"] = float(len(problems))
    return out


def _sampled(run: Run, mine: list[Problem]) -> dict[str, list[float]]:
    """pass@k (and the pairwise distance) over ``eval_samples`` samples of each problem:
    name -> [sum over problems, problems counted, problems without a value]."""
    cfg = run.cfg
    n = cfg.eval_samples
    spec, greedy = run.eval_sampling()
    spec = dataclasses.replace(spec, group_size=n)
    params = dataclasses.replace(greedy, temperature=cfg.temperature, top_p=cfg.top_p,
                                 generator=run.sampling_for(-1).generator)  # fmt: skip
    texts: list[str] = []
    per_call = max(1, cfg.rollouts_per_step // n)
    with gathered(run.policy):
        for s in range(0, len(mine), per_call):
            batch = mine[s : s + per_call]
            texts.extend(
                rollout_batch(run.sampler, run.tokenizer, batch, spec, params, run.ors).texts
            )
    ks = ks_for(n)
    sums = {f"pass@{k}": [0.0, 0.0, 0.0] for k in ks} | {"pairwise_distance": [0.0, 0.0, 0.0]}
    if not mine:
        return sums
    groups = [
        ScoreGroup(
            id=f"{p.id}-s",
            prompt=p.question,
            reference=p.reference,
            responses=texts[i * n : (i + 1) * n],
        )
        for i, p in enumerate(mine)
    ]
    result = run.rewards.score(cfg.eval_recipe, groups)
    names = result.component_names()
    acc = result.flat_component("math_accuracy") if "math_accuracy" in names else result.flat()
    div = result.flat_component("diversity") if "diversity" in names else None
    for i in range(len(mine)):
        right = [v for v in acc[i * n : (i + 1) * n] if not math.isnan(v)]
        for k in ks:
            cell = sums[f"pass@{k}"]
            if len(right) >= k:
                cell[0] += pass_at_k(len(right), sum(v >= 0.5 for v in right), k)
                cell[1] += 1
            else:
                cell[2] += 1
        d = [v for v in div[i * n : (i + 1) * n] if not math.isnan(v)] if div else []
        cell = sums["pairwise_distance"]
        if len(d) >= 2:
            cell[0] += pairwise_distance(d)
            cell[1] += 1
        elif div is not None:
            cell[2] += 1
    return sums
