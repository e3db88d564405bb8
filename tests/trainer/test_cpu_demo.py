"""The CPU demo of docs/quickstart.md learns: ``python -m arbiter.trainer.sft demo`` (data,
the tiny model, a short warm start), then GRPO with configs/cpu-demo.yaml through a real
gateway + verify service. The reward of the last steps is above that of the first ones
(no wall-clock bound: the run is a fixed number of steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.loop import train
from arbiter.trainer.sft import demo

REPO = Path(__file__).resolve().parents[2]
WINDOW = 5


@pytest.mark.slow  # the warm start and 40 GRPO steps: 15-20 s on two idle cores, 42 s loaded
def test_the_cpu_demo_reward_rises(gateway_url: str, tmp_path: Path) -> None:
    made = demo(tmp_path / "demo")
    assert (Path(made["model"]) / "config.json").exists()
    run = tmp_path / "run"
    cfg = TrainerConfig.load(
        REPO / "configs" / "cpu-demo.yaml",
        [
            f"model={made['model']}", f"data_dir={made['data']}", f"run_dir={run}",
            f"gateway_url={gateway_url}", "progress=false", "eval_every=0", "plot=false",
            "save_every=-1",
        ],
    )  # fmt: skip
    train(cfg)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rewards = [r["reward/mean"] for r in map(json.loads, lines) if r["kind"] == "train"]
    assert len(rewards) == cfg.steps
    first = sum(rewards[:WINDOW]) / WINDOW
    last = sum(rewards[-WINDOW:]) / WINDOW
    assert last > first + 0.1, rewards
