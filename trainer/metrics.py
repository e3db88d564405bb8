"""Run-directory logging: metrics.jsonl (one line per step / eval), progress bar, curves.png.

Only rank 0 writes. Every step line carries ``step`` and ``kind`` ("train", "eval",
"skip"); curves.png plots train reward (mean and per component) and eval accuracy.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from arbiter.trainer.evaluate import pairwise_distance
from arbiter.trainer.grpo import group_std_is_zero
from arbiter.trainer.rewards import BatchRewards
from arbiter.trainer.rollout import Rollout

log = logging.getLogger("trainer")


NO_SIGNAL_EVERY = 20  # steps between repeats of the "no reward variance" warning


class RunLogger:
    def __init__(
        self,
        run_dir: Path,
        *,
        total_steps: int,
        start_step: int,
        enabled: bool,
        progress: bool,
        kl_term: bool = True,
    ) -> None:
        self.run_dir = run_dir
        self.enabled = enabled
        self.kl_term = kl_term  # beta > 0: the KL column means something
        self.flat_steps = 0  # consecutive steps in which no group's rewards varied
        self.path = run_dir / "metrics.jsonl"
        self.bar: Any = None
        if enabled and progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc="grpo", dynamic_ncols=True)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"time": round(time.time(), 3), **record}
        with self.path.open("a") as f:
            f.write(json.dumps(_clean(record)) + "\n")

    def step(self, record: dict[str, Any]) -> None:
        self.write({"kind": "train", **record})
        self._warn_if_flat(record)
        if self.bar is not None:
            self.bar.update(1)
            shown = {"reward": f"{record.get('reward/mean', float('nan')):.3f}"}
            if self.kl_term:
                shown["kl"] = f"{record.get('kl', 0.0):.4f}"
            shown["len"] = f"{record.get('completion_len/mean', 0):.0f}"
            shown["wait"] = f"{record.get('time/reward_wait', 0):.2f}s"
            self.bar.set_postfix(shown)
        elif self.enabled:
            log.info(
                "step %d reward %.3f len %.1f step %.2fs",
                record["step"],
                record.get("reward/mean", float("nan")),
                record.get("completion_len/mean", 0.0),
                record.get("time/step", 0.0),
            )

    def _warn_if_flat(self, record: dict[str, Any]) -> None:
        """GRPO learns from reward differences within a group: a step in which every group's
        rewards are equal (all right, all wrong, all null) moves nothing. Said at the first
        such step and every ``NO_SIGNAL_EVERY`` in a row after it, not silently."""
        if record.get("groups/zero_std_frac") != 1.0:
            self.flat_steps = 0
            return
        self.flat_steps += 1
        if self.enabled and self.flat_steps % NO_SIGNAL_EVERY == 1:
            log.warning(
                "step %d: no group's rewards varied (%d step(s) in a row): no learning signal. "
                "Rewards all equal (mean %.3f) mean the task is too hard or too easy for the "
                "model, or the recipe scores everything alike: check a few rewards with "
                "`arbiter score`, raise group_size, or change the recipe",
                record["step"],
                self.flat_steps,
                record.get("reward/mean", float("nan")),
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(run_dir: Path) -> Path | None:
    """curves.png: train reward (mean + components) and eval accuracy against step."""
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    if not train and not evals:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    steps = [r["step"] for r in train]
    comps = {k for r in train for k in r if k.startswith("reward/") and k.endswith("/mean")}
    keys = ["reward/mean", *sorted(comps - {"reward/mean"})]
    for key in keys:
        ys = [r.get(key) for r in train]
        ax.plot(
            steps,
            [math.nan if y is None else y for y in ys],
            label=key.removeprefix("reward/").removesuffix("/mean") or "reward",
        )
    ax.set_xlabel("step")
    ax.set_title("train reward (mean per step)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[1]
    if evals:
        ax.plot([r["step"] for r in evals], [r.get("eval/accuracy") for r in evals], marker="o")
    ax.set_xlabel("step")
    ax.set_title("held-out accuracy (greedy)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = run_dir / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_summary(run_dir: Path, *, plotted: bool = True) -> str:
    """The end-of-run summary (from metrics.jsonl, so a resumed run's earlier steps count):
    steps, reward first -> last (means over the first and the last few steps), held-out
    accuracy first -> last, and where the curves, metrics and checkpoints are."""
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval" and r.get("eval/accuracy") is not None]
    skipped = sum(1 for r in records if r.get("kind") == "skip")
    head = f"run finished: {len(train)} step(s) trained"
    lines = [head + (f", {skipped} skipped" if skipped else "")]
    rewards: list[tuple[int, float]] = [
        (int(r["step"]), float(r["reward/mean"])) for r in train if r.get("reward/mean") is not None
    ]
    if rewards:
        k = min(5, max(1, len(rewards) // 3))
        first, last = rewards[:k], rewards[-k:]
        lines.append(
            f"  reward     {_avg(first):.3f} -> {_avg(last):.3f}  (mean of steps "
            f"{_span(first)} -> {_span(last)})"
        )
    if evals:
        a, b = evals[0], evals[-1]
        lines.append(
            f"  held-out   {a['eval/accuracy']:.3f} -> {b['eval/accuracy']:.3f}  "
            f"(greedy accuracy at step {a['step']} -> {b['step']})"
        )
    curves = run_dir / "curves.png"
    if plotted and curves.exists():
        lines.append(f"  curves     {curves}")
    lines.append(f"  metrics    {run_dir / 'metrics.jsonl'}")
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if (p / "done").exists())
    if ckpts:
        lines.append(f"  checkpoint {ckpts[-1]}  (resume=true continues from it)")
    return "\n".join(lines)


def _avg(pairs: list[tuple[int, float]]) -> float:
    return sum(x for _, x in pairs) / len(pairs)


def _span(pairs: list[tuple[int, float]]) -> str:
    lo, hi = pairs[0][0], pairs[-1][0]
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _mean_std(xs: list[float]) -> tuple[float, float]:
    ok = [x for x in xs if not math.isnan(x)]
    if not ok:
        return math.nan, math.nan
    m = sum(ok) / len(ok)
    return m, math.sqrt(sum((x - m) ** 2 for x in ok) / len(ok))


def step_metrics(
    result: BatchRewards, r: torch.Tensor, G: int, roll: Rollout, stats: dict[str, float]
) -> dict[str, Any]:
    out: dict[str, Any] = dict(stats)
    out["reward/mean"], out["reward/std"] = _mean_std(r.tolist())
    out["reward/null_frac"] = float(torch.isnan(r).float().mean())
    out["reward/errors"] = float(sum(result.error_kinds().values()))
    for name in result.component_names():
        out[f"reward/{name}/mean"], out[f"reward/{name}/std"] = _mean_std(
            result.flat_component(name)
        )
    out["groups/zero_std_frac"] = float(group_std_is_zero(r, G).float().mean())
    lens = roll.loss_mask.sum(-1).float()
    out["completion_len/mean"], out["completion_len/max"] = float(lens.mean()), float(lens.max())
    out["turns/mean"] = sum(roll.turns) / max(1, len(roll.turns))
    if roll.tool_calls:  # multi-turn: how the policy uses the environment's tool
        n = len(roll.tool_calls)
        out["tools/calls_per_episode"] = sum(roll.tool_calls) / n
        out["tools/episode_frac"] = sum(c > 0 for c in roll.tool_calls) / n
        out["tools/errors"] = float(sum(roll.tool_errors))
        out["time/env"] = roll.env_s  # inside the rollout: its environments' turns
    if "diversity" in result.component_names():  # mean pairwise distance within a group
        div = result.flat_component("diversity")
        dists = [pairwise_distance([v for v in div[g : g + G] if not math.isnan(v)])
                 for g in range(0, len(div), G)]  # fmt: skip
        out["groups/pairwise_distance"], _ = _mean_std(dists)
    out["tokens/action"] = float(roll.action_tokens)
    return out


def reduce_record(record: dict[str, Any], dist: Any, device: torch.device) -> dict[str, Any]:
    """Average numeric metrics over ranks (max for maxima, sum for token counts)."""
    if not dist.enabled:
        return record
    keys = sorted(k for k, v in record.items() if isinstance(v, float) and k != "lr")
    vals = dist.all_sum([0.0 if math.isnan(record[k]) else record[k] for k in keys], device)
    out = dict(record)
    for k, v in zip(keys, vals, strict=True):
        out[k] = v if k.startswith("tokens") else v / dist.world
    return out
