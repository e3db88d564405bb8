"""Held-out evaluation: greedy completions, accuracy from the gateway (verify's math_accuracy).

Problems are sharded over ranks; sums are all-reduced so every rank gets the same numbers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from arbiter.proto.gateway import ScoreGroup
from arbiter.trainer.env import rollout_batch
from arbiter.trainer.parallel import gathered

if TYPE_CHECKING:
    from arbiter.trainer.run import Run


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
            texts.extend(rollout_batch(run.sampler, tokenizer, batch, spec, params).texts)
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
    names = sorted(sums)
    # every rank must reduce the same keys: the eval recipe is the same on all ranks
    flat = dist.all_sum([x for n in names for x in sums[n]], run.device)
    out: dict[str, float] = {}
    for i, n in enumerate(names):
        total, count, nulls = flat[3 * i : 3 * i + 3]
        out[f"eval/{n}"] = total / count if count else math.nan
        out[f"eval/{n}/null"] = nulls
    lens = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    out["eval/completion_len"] = sum(lens) / max(1, len(lens))
    # accuracy: the math_accuracy component when the eval recipe has it, else the reward
    out["eval/accuracy"] = out.get("eval/math_accuracy", out.get("eval/reward", math.nan))
    out["eval/problems"] = float(len(problems))
    return out
