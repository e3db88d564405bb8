"""One rank of tests/trainer/test_sampler_compile.py's FSDP2 case, under torchrun with gloo.

    python -m torch.distributed.run --nproc_per_node 2 sampler_compile_worker.py MODEL OUT

The FSDP2-sharded tiny model's compiled sampler (a recording torch.compile backend) samples
three times, gathered as the trainer's rollouts are, with a GRPO-like training step (forward,
backward, AdamW, whose first step allocates its state) after each: prompts of 5 tokens twice,
then rank 0 alone a prompt of 60 (a new KV-cache size). OUT/compiles-RANK.json lists, per
rollout, the node count of every graph compiled during it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from arbiter.trainer import parallel
from arbiter.trainer.generation import Sampler
from arbiter.trainer.grpo import build_optimizer
from arbiter.trainer.sampling import SamplingParams
from arbiter.trainer.setup import init_distributed, load_model

GRAPHS: list[int] = []


def record(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
    GRAPHS.append(len(gm.graph.nodes))
    return gm.forward


def main(model_dir: Path, out: Path) -> None:
    dist, device = init_distributed("cpu", 1)
    policy = load_model(model_dir, device, "fp32", trainable=True)
    parallel.wrap(policy, fsdp=True, world=2, device=device, precision="fp32")
    opt, _ = build_optimizer(policy, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    real = torch.compile
    torch.compile = lambda fn, **kw: real(fn, **(kw | {"backend": record}))  # type: ignore[assignment]
    sampler = Sampler(policy, compile=True, keep_cache=False, length_round=8)
    rollouts = []
    for i, prompt_len in enumerate([5, 5, 60 if dist.rank == 0 else 5]):
        gen = torch.Generator().manual_seed(i)
        ids = torch.randint(10, 100, (4, prompt_len), generator=gen)
        before = len(GRAPHS)
        with parallel.gathered(policy):
            sampler(ids, torch.ones_like(ids), SamplingParams(12, -1, 0, generator=gen))
        rollouts.append(GRAPHS[before:])
        x = torch.randint(10, 100, (2, 8), generator=gen)
        policy(x).logits.float().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    (out / f"compiles-{dist.rank}.json").write_text(json.dumps({"rollouts": rollouts}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
