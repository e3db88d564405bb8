"""The policy update: mu passes of the clipped surrogate over a batch, micro-batched.

DDP averages gradients over ranks, so each rank divides its loss by the global token (or
sequence) count over the world size: the result is the exact global token/sequence mean.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.grpo import completion_logits, grpo_loss, token_entropy, token_logprobs
from arbiter.trainer.rollout import Rollout, autocast


def train_on_batch(
    cfg: TrainerConfig,
    model: Any,
    opt: torch.optim.Optimizer,
    roll: Rollout,
    adv: torch.Tensor,
    dist: Any,
    precision: str,
) -> dict[str, float]:
    """mu passes of clipped-surrogate updates of ``model`` (the policy or its DDP wrapper);
    returns summed token statistics."""
    S, N, mbs = len(roll), roll.n_completion, cfg.micro_batch_size
    device = roll.input_ids.device
    lens = roll.loss_mask.sum(-1)
    tokens, seqs = dist.all_sum([float(lens.sum()), float((lens > 0).sum())], device)
    # DDP averages gradients over ranks, so each rank divides by the global count / world
    norm = max(1.0, tokens if cfg.loss_agg == "token_mean" else seqs) / dist.world
    acc = {
        "loss": 0.0,
        "pg": 0.0,
        "kl": 0.0,
        "clipped": 0.0,
        "ratio": 0.0,
        "entropy": 0.0,
        "grad_norm": 0.0,
    }
    for it in range(cfg.mu):
        opt.zero_grad(set_to_none=True)
        starts = list(range(0, S, mbs))
        for k, s in enumerate(starts):
            sl = slice(s, s + mbs)
            ids, attn, mask = roll.input_ids[sl], roll.attention_mask[sl], roll.loss_mask[sl]
            sync = k == len(starts) - 1 or not dist.enabled
            with contextlib.nullcontext() if sync else model.no_sync(), autocast(device, precision):
                logits = completion_logits(model, ids, attn, N)
                logps = token_logprobs(logits, ids[:, -N:])
                old = roll.old_logps[sl] if roll.old_logps is not None else logps.detach()
                ref = roll.ref_logps[sl] if roll.ref_logps is not None else None
                parts = grpo_loss(
                    logps,
                    old,
                    adv[sl],
                    mask,
                    ref_logps=ref,
                    beta=cfg.beta,
                    eps_low=cfg.eps_low,
                    eps_high=cfg.eps_high,
                    agg=cfg.loss_agg,
                    norm=norm,
                )
                parts.loss.backward()
            if it == 0:
                ent = token_entropy(logits.detach())
                acc["entropy"] += float((ent * mask).sum())
                acc["pg"] += float(parts.pg_sum)
                acc["kl"] += float(parts.kl_sum)
            acc["clipped"] += float(parts.clipped)
            acc["ratio"] += float(parts.ratio_sum)
            acc["loss"] += float(parts.loss.detach()) / cfg.mu
            del logits, logps, parts
        if cfg.max_grad_norm > 0:
            acc["grad_norm"] = float(
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            )
        opt.step()
    local = max(1.0, float(lens.sum()))
    return {
        "loss": acc["loss"],
        "grad_norm": acc["grad_norm"],
        "entropy": acc["entropy"] / local,
        "kl": acc["kl"] / local,
        "pg_loss": acc["pg"] / local,
        "clip_frac": acc["clipped"] / (local * cfg.mu),
        "ratio/mean": acc["ratio"] / (local * cfg.mu),
    }
