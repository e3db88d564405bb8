"""Held-out evaluation: greedy completions, accuracy from the gateway (verify's math_accuracy).

Problems are sharded over ranks; sums are all-reduced so every rank gets the same numbers.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from arbiter.proto.gateway import ScoreGroup
from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.data import Problem
from arbiter.trainer.env import rollout_batch
from arbiter.trainer.rewards import RewardClient
from arbiter.trainer.setup import Dist


@torch.no_grad()
def evaluate(
    cfg: TrainerConfig,
    model: Any,
    tokenizer: Any,
    problems: list[Problem],
    rewards: RewardClient,
    dist: Dist,
    device: torch.device,
    precision: str,
) -> dict[str, float]:
    mine = problems[dist.rank :: dist.world]
    max_new = cfg.eval_max_new_tokens or cfg.max_new_tokens
    texts: list[str] = []
    chunk = max(1, cfg.rollouts_per_step)
    for s in range(0, len(mine), chunk):
        batch = mine[s : s + chunk]
        common: dict[str, Any] = dict(
            group_size=1,
            max_new_tokens=max_new,
            temperature=0.0,
            top_p=1.0,
            max_prompt_tokens=cfg.max_prompt_tokens,
            system_prompt=cfg.system_prompt,
            generator=None,
            precision=precision,
            device=device,
        )
        r = rollout_batch(model, tokenizer, batch, env=cfg.env, max_turns=cfg.max_turns, **common)
        texts.extend(r.texts)
    sums: dict[str, list[float]] = {}
    if mine:
        groups = [
            ScoreGroup(id=p.id, prompt=p.question, reference=p.reference, responses=[t])
            for p, t in zip(mine, texts, strict=True)
        ]
        result = rewards.score(cfg.eval_recipe, groups)
        for name in ["reward", *result.component_names()]:
            vals = result.flat() if name == "reward" else result.flat_component(name)
            ok = [v for v in vals if not math.isnan(v)]
            sums[name] = [sum(ok), float(len(ok)), float(len(vals) - len(ok))]
    names = sorted(sums)
    # every rank must reduce the same keys: the eval recipe is the same on all ranks
    flat = dist.all_sum([x for n in names for x in sums[n]], device)
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
