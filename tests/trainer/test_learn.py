"""A toy task the tiny random model learns in ~60 CPU steps through gateway + verify.

Every problem's answer is 7, scored by the gateway's math_accuracy (an inline recipe). A
random policy (8 new tokens over a ~400-token vocabulary) ends with the digit 7 about once
per step of 32 samples; GRPO must turn that into "mostly ends with 7".
"""

from __future__ import annotations

import json
from pathlib import Path

from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.loop import train


def test_mean_reward_rises_on_toy_task(
    tiny_model_small_vocab: Path, seven_dir: Path, gateway_url: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    cfg = TrainerConfig(
        model=str(tiny_model_small_vocab),
        data_dir=str(seven_dir),
        run_dir=str(run),
        gateway_url=gateway_url,
        recipe={"components": [{"name": "math_accuracy", "weight": 1.0}]},
        steps=60,
        rollouts_per_step=32,
        group_size=8,
        micro_batch_size=32,
        max_new_tokens=8,
        lr=1e-2,
        beta=0.0,
        seed=0,
        cpu_threads=1,
        device="cpu",
        progress=False,
    )
    train(cfg)
    rewards = [
        r["reward/mean"]
        for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]
    assert len(rewards) == 60
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.25, (first, last, rewards)
    assert (run / "curves.png").exists()
