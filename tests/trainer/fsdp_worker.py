"""One rank of the FSDP2 test (tests/trainer/test_fsdp.py), run under torchrun with gloo.

    python -m torch.distributed.run --nproc_per_node 2 tests/trainer/fsdp_worker.py MODEL OUT

Every rank builds the same batch (8 sequences sampled from the unsharded tiny model), takes
its half, and then, on the FSDP2-sharded model:
1. samples greedily (gathered) and records whether that equals the unsharded model's sample;
2. takes one GRPO step (micro-batches of 2, chunked log-probs), saves a sharded checkpoint;
3. samples (seeded) and takes a second step;
4. builds a fresh sharded model, resumes from the checkpoint, samples and steps again.
Rank 0 writes the full parameters after steps 1 and 2 (and 2 resumed) and the samples to
OUT/result.pt for the test to compare with a single-process step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from arbiter.trainer import checkpoint, parallel
from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.data import Problem
from arbiter.trainer.generation import Sampler
from arbiter.trainer.grpo import build_optimizer
from arbiter.trainer.rollout import Rollout, RolloutSpec, single_turn
from arbiter.trainer.sampling import SamplingParams
from arbiter.trainer.setup import init_distributed, load_model, load_tokenizer
from arbiter.trainer.update import train_on_batch

PROBLEMS = [
    Problem(id=f"p{i}", question=f"What is {i} + {i}?", reference=str(2 * i)) for i in range(4)
]
SPEC = RolloutSpec(group_size=2, max_prompt_tokens=128)
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5, -1.0, 1.0, 2.0, -2.0])


def config(model: Path) -> TrainerConfig:
    # per rank: 4 sequences in micro-batches of 2 (gradient sync only on the last)
    return TrainerConfig(
        model=str(model),
        rollouts_per_step=4,
        group_size=2,
        micro_batch_size=2,
        lr=1e-2,
        logprob_chunk_tokens=8,
        beta=0.0,
    )


def batch(model_dir: Path, tok: Any) -> Rollout:
    full = load_model(model_dir, torch.device("cpu"), "fp32", trainable=False)
    params = SamplingParams.for_tokenizer(tok, 8, generator=torch.Generator().manual_seed(0))
    return single_turn(Sampler(full), tok, PROBLEMS, SPEC, params)


def half(roll: Rollout, rank: int) -> Rollout:
    sl = slice(4 * rank, 4 * rank + 4)
    return Rollout(
        problems=roll.problems[2 * rank : 2 * rank + 2],
        prompts=roll.prompts,
        input_ids=roll.input_ids[sl],
        attention_mask=roll.attention_mask[sl],
        loss_mask=roll.loss_mask[sl],
        texts=roll.texts[sl],
    )


def sharded(model_dir: Path, cfg: TrainerConfig) -> tuple[Any, Any, Any]:
    policy = load_model(model_dir, torch.device("cpu"), "fp32", trainable=True)
    parallel.wrap(policy, fsdp=True, world=2, device=torch.device("cpu"), precision="fp32")
    opt, sched = build_optimizer(
        policy, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0
    )
    return policy, opt, sched


def full_params(model: Any) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in model.named_parameters()
    }


def sample(model: Any, roll: Rollout, tok: Any, seed: int | None) -> torch.Tensor:
    P = roll.input_ids.shape[1] - roll.n_completion
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    params = SamplingParams.for_tokenizer(
        tok, 8, temperature=0.0 if seed is None else 1.0, generator=gen
    )
    with parallel.gathered(model):
        ids, _ = Sampler(model)(roll.input_ids[:, :P], roll.attention_mask[:, :P], params)
    return ids


def main(model_dir: Path, out: Path) -> None:
    dist, _ = init_distributed("cpu", 1)
    tok = load_tokenizer(model_dir)
    cfg = config(model_dir)
    roll = batch(model_dir, tok)
    mine, adv = half(roll, dist.rank), ADV[4 * dist.rank : 4 * dist.rank + 4]
    policy, opt, sched = sharded(model_dir, cfg)
    result: dict[str, Any] = {"before": full_params(policy)}
    unsharded = load_model(model_dir, torch.device("cpu"), "fp32", trainable=False)
    result["greedy_same_as_unsharded"] = torch.equal(
        sample(policy, roll, tok, None), sample(unsharded, roll, tok, None)
    )

    def step() -> dict[str, float]:
        stats = train_on_batch(cfg, policy, opt, mine, adv, dist, "fp32")
        sched.step()
        return stats

    result["stats1"] = step()
    result["step1"] = full_params(policy)
    result["grad1"] = {n: p.grad.full_tensor() for n, p in policy.named_parameters()}
    checkpoint.save(out / "run", 1, policy, tok, opt, sched, {"recipe_fingerprint": "f"}, 1, dist)
    result["sample2"] = sample(policy, roll, tok, 5)
    step()
    result["step2"] = full_params(policy)

    policy, opt, sched = sharded(model_dir, cfg)  # a new process would start here
    state = checkpoint.load(checkpoint.latest(out / "run") or out, policy, opt, dist.rank)
    sched.load_state_dict(state["scheduler"])
    checkpoint.restore_rng(state)
    result["sample2_resumed"] = sample(policy, roll, tok, 5)
    step()
    result["step2_resumed"] = full_params(policy)
    result["roll"] = {
        "input_ids": roll.input_ids,
        "attention_mask": roll.attention_mask,
        "loss_mask": roll.loss_mask,
    }
    torch.save(result, out / f"result-{dist.rank}.pt")
    dist.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
