"""The policy update: mu passes of the clipped surrogate over a batch, micro-batched.

DDP and FSDP2 average gradients over ranks, so each rank divides its loss by the global
token (or sequence) count over the world size: the result is the exact global
token/sequence mean. Log-probs come from ``trainer.logprobs`` in chunks of
``logprob_chunk_tokens`` (never the whole [tokens, vocab] logits).
"""

from __future__ import annotations

from typing import Any

import torch

from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.grpo import grpo_loss
from arbiter.trainer.logprobs import completion_logprobs
from arbiter.trainer.parallel import clip_grad_norm, grad_sync
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
    """mu passes of clipped-surrogate updates of ``model`` (the policy, sharded or not, or
    its DDP wrapper); returns summed token statistics."""
    S, N, mbs = len(roll), roll.n_completion, cfg.micro_batch_size
    device = roll.input_ids.device
    lens = roll.loss_mask.sum(-1)
    tokens, seqs = dist.all_sum([float(lens.sum()), float((lens > 0).sum())], device)
    norm = max(1.0, tokens if cfg.loss_agg == "token_mean" else seqs) / dist.world
    acc = dict.fromkeys(("loss", "pg", "kl", "clipped", "ratio", "entropy", "grad_norm"), 0.0)
    starts = list(range(0, S, mbs))
    for it in range(cfg.mu):
        opt.zero_grad(set_to_none=True)
        for k, s in enumerate(starts):
            sl = slice(s, s + mbs)
            ids, attn, mask = roll.input_ids[sl], roll.attention_mask[sl], roll.loss_mask[sl]
            with grad_sync(model, k == len(starts) - 1), autocast(device, precision):
                logps, ent = completion_logprobs(
                    model, ids, attn, N, chunk_tokens=cfg.logprob_chunk_tokens
                )  # (mbs, N) each
                old = roll.old_logps[sl] if roll.old_logps is not None else logps.detach()
                ref = roll.ref_logps[sl] if roll.ref_logps is not None else None
                parts = grpo_loss(
                    logps, old, adv[sl], mask, ref_logps=ref, beta=cfg.beta,
                    eps_low=cfg.eps_low, eps_high=cfg.eps_high, agg=cfg.loss_agg, norm=norm,
                )  # fmt: skip
                parts.loss.backward()
            if it == 0:
                acc["entropy"] += float((ent * mask).sum())
                acc["pg"] += float(parts.pg_sum)
                acc["kl"] += float(parts.kl_sum)
            acc["clipped"] += float(parts.clipped)
            acc["ratio"] += float(parts.ratio_sum)
            acc["loss"] += float(parts.loss.detach()) / cfg.mu
            del logps, ent, parts
        if cfg.max_grad_norm > 0:
            acc["grad_norm"] = clip_grad_norm(model, cfg.max_grad_norm)
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
