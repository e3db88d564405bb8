"""Side-by-side curves of learning runs (``bench.trainer.learn``'s metrics-*.jsonl).

    python -m bench.trainer.curves tool OUT.png tool=M1.jsonl notool=M2.jsonl
    python -m bench.trainer.curves diverse OUT.png gsm8k=M1.jsonl gsm8k-diverse=M2.jsonl ...

``tool``: held-out greedy accuracy per evaluation, and per step the share of episodes that
call the calculator and the sampled accuracy. ``diverse``: held-out greedy accuracy, pass@16
and the mean pairwise distance within a problem's 16 samples, per evaluation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _rows(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("kind") == "train"], [
        r for r in rows if r.get("kind") == "eval"
    ]


def _plot(ax: Any, rows: list[dict[str, Any]], key: str, label: str, **kw: Any) -> None:
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    if pts:
        ax.plot(*zip(*pts, strict=True), label=label, **kw)


def plot(kind: str, out: Path, runs: dict[str, Path], title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {name: _rows(path) for name, path in runs.items()}
    panels = (
        [("eval/accuracy", "held-out accuracy (greedy)", True),
         ("tools/episode_frac", "episodes that call the calculator", False),
         ("reward/math_accuracy/mean", "sampled accuracy (train)", False)]
        if kind == "tool" else
        [("eval/accuracy", "held-out accuracy (greedy)", True),
         ("eval/pass@16", "held-out pass@16", True),
         ("eval/pairwise_distance", "pairwise distance within 16 samples", True)]
    )  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    for ax, (key, name, is_eval) in zip(axes, panels, strict=True):
        for run, (train, evals) in data.items():
            _plot(ax, evals if is_eval else train, key, run, marker="o" if is_eval else None)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        if key != "eval/pairwise_distance":
            ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("kind", choices=["tool", "diverse"])
    p.add_argument("out", type=Path)
    p.add_argument("runs", nargs="+", help="NAME=metrics.jsonl")
    p.add_argument("--title", default="")
    a = p.parse_args(argv)
    runs = {r.rpartition("=")[0]: Path(r.rpartition("=")[2]) for r in a.runs}
    plot(a.kind, a.out, runs, a.title)


if __name__ == "__main__":
    main()
