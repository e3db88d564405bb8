"""Two GRPO steps of TRL's own GRPOTrainer on the tiny model (CPU), rewards from Arbiter.

    python tests/arbiter/integrations/grpo_run.py URL MODEL OUT RECIPE COMPONENT
    torchrun --nproc_per_node 2 tests/arbiter/integrations/grpo_run.py …   (gloo)

Reward functions: COMPONENT alone (recorded: each rank's prompts and values go to
OUT/rank<R>.jsonl) and the recipe total. One global batch of 4 completions (one group) per
step, split over the ranks; the trainer's log history goes to OUT/log.json.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from arbiter.integrations.trl import ArbiterReward


class Recorded(ArbiterReward):
    def __call__(self, prompts: Any, completions: Any, **kwargs: Any) -> list[float | None]:
        values = super().__call__(prompts, completions, **kwargs)
        with open(f"{OUT}/rank{os.environ.get('RANK', '0')}.jsonl", "a") as f:
            f.write(json.dumps({"prompts": prompts, "completions": completions,
                                "answer": kwargs["answer"], "values": values}) + "\n")  # fmt: skip
        return values


if __name__ == "__main__":
    URL, MODEL, OUT, RECIPE, COMPONENT = sys.argv[1:6]
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "answer": f"#### {2 * i}"} for i in range(8)]  # fmt: skip
    funcs: list[Any] = [Recorded(COMPONENT, RECIPE, base_url=URL),
                        ArbiterReward(recipe=RECIPE, base_url=URL)]  # fmt: skip
    args = GRPOConfig(
        output_dir=OUT, per_device_train_batch_size=4 // int(os.environ.get("WORLD_SIZE", "1")),
        num_generations=4,
        max_completion_length=8, max_steps=2, logging_steps=1, use_cpu=True, bf16=False,
        report_to=[], save_strategy="no", reward_weights=[0.0, 1.0],
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=MODEL, reward_funcs=funcs, args=args, train_dataset=Dataset.from_list(rows)
    )
    try:
        trainer.train()
        if os.environ.get("RANK", "0") == "0":
            with open(f"{OUT}/log.json", "w") as f:
                json.dump(trainer.state.log_history, f)
    finally:
        # Destroys the process group. Without it, torch 2.13's gloo group aborts the process at
        # interpreter exit (SIGABRT, "terminate called without an active exception") in about
        # one run in three, after the work is done: any torchrun script's bug, not Arbiter's.
        trainer.accelerator.end_training()
