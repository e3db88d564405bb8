"""The policy update: mu passes of the clipped surrogate over a batch, micro-batched.

DDP and FSDP2 average gradients over ranks, so each rank divides its loss by the global
token (or sequence) count over the world size: the result is the exact global
token/sequence mean. Log-probs come from ``trainer.logprobs`` in chunks of
``logprob_chunk_tokens`` (never the whole [tokens, vocab] logits). Each micro-batch is first
trimmed of the columns none of its rows needs (shared left padding, completion columns after
its last action token), and the logging sums stay on the device until the batch is done.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.grpo import grpo_loss
from arbiter.trainer.logprobs import completion_logprobs, micro_batches
from arbiter.trainer.parallel import clip_grad_norm, grad_sync, is_sharded
from arbiter.trainer.rollout import Rollout, autocast


def train_on_batch(
    cfg: TrainerConfig,
    model: Any,
    opt: torch.optim.Optimizer,
    roll: Rollout,
    adv: torch.Tensor,
    dist: Any,
    precision: str,
    *,
    trim: bool = True,
) -> dict[str, float]:
    """mu passes of clipped-surrogate updates of ``model`` (the policy, sharded or not, or
    its DDP wrapper); returns summed token statistics. ``trim``: drop each micro-batch's
    unneeded padding columns (exact; False only to measure what it saves)."""
    N, mbs = roll.n_completion, cfg.micro_batch_size
    device = roll.input_ids.device
    lens = roll.loss_mask.sum(-1)
    tokens, seqs = dist.all_sum([float(lens.sum()), float((lens > 0).sum())], device)
    norm = max(1.0, tokens if cfg.loss_agg == "token_mean" else seqs) / dist.world
    names = ("loss", "pg", "kl", "clipped", "ratio", "entropy")
    acc: dict[str, Any] = {k: torch.zeros((), device=device) for k in names}
    grad_norm = 0.0
    compile = train_compiled(cfg, model, device)
    mbatches = micro_batches(
        model, roll.input_ids, roll.attention_mask, roll.loss_mask, mbs, trim=trim,
        shared_prefix=cfg.shared_prefix, chunk_tokens=cfg.logprob_chunk_tokens,
    )  # fmt: skip
    for it in range(cfg.mu):
        opt.zero_grad(set_to_none=True)
        for k, (sl, ids, attn, n, plan) in enumerate(mbatches):
            mask = roll.loss_mask[sl]
            with grad_sync(model, k == len(mbatches) - 1), autocast(device, precision):
                logps, ent = completion_logprobs(
                    model, ids, attn, n, chunk_tokens=cfg.logprob_chunk_tokens, compile=compile,
                    shared_prefix=plan or False, keep_logits=cfg.logprob_keep_logits,
                )  # fmt: skip
                # (mbs, n) each; the dropped columns (no loss token) get 0
                logps, ent = F.pad(logps, (0, N - n)), F.pad(ent, (0, N - n))
                old = roll.old_logps[sl] if roll.old_logps is not None else logps.detach()
                ref = roll.ref_logps[sl] if roll.ref_logps is not None else None
                parts = grpo_loss(
                    logps, old, adv[sl], mask, ref_logps=ref, beta=cfg.beta,
                    eps_low=cfg.eps_low, eps_high=cfg.eps_high, agg=cfg.loss_agg, norm=norm,
                )  # fmt: skip
                parts.loss.backward()
            if it == 0:
                acc["entropy"] += (ent * mask).sum()
                acc["pg"] += parts.pg_sum
                acc["kl"] += parts.kl_sum
            acc["clipped"] += parts.clipped
            acc["ratio"] += parts.ratio_sum
            acc["loss"] += parts.loss.detach() / cfg.mu
            del logps, ent, parts
        if cfg.max_grad_norm > 0:
            grad_norm = clip_grad_norm(model, cfg.max_grad_norm)
        opt.step()
    sums = {k: float(v) for k, v in zip(acc, torch.stack(list(acc.values())).tolist(), strict=True)}
    local = max(1.0, float(lens.sum()))
    return {
        "loss": sums["loss"],
        "grad_norm": grad_norm,
        "entropy": sums["entropy"] / local,
        "kl": sums["kl"] / local,
        "pg_loss": sums["pg"] / local,
        "clip_frac": sums["clipped"] / (local * cfg.mu),
        "ratio/mean": sums["ratio"] / (local * cfg.mu),
    }


def multi_turn_env(env: str) -> bool:
    """Rollouts with observation tokens: the calculator in process or any ORS episode."""
    return env == "calculator" or env.startswith("ors:")


def train_compiled(cfg: TrainerConfig, model: Any, device: torch.device) -> bool:
    """Whether the training forward/backward runs compiled: ``compile_train`` on a GPU, not
    under FSDP2 (not measured there), and not for multi-turn rollouts (``env=calculator``):
    there inductor's compiled backward failed at run time on an H100, at the first batch with
    observation tokens ("shape '[1431, 256]' is invalid for input of size 1264"), where the
    compile-time fallback to the eager layer cannot catch it. ``multi_turn_eager`` warns once
    at start."""
    return (
        cfg.compile_train
        and not multi_turn_env(cfg.env)
        and device.type == "cuda"
        and not is_sharded(model)
    )


def multi_turn_eager(cfg: TrainerConfig, device: torch.device) -> str | None:
    """The one start-of-run warning when ``compile_train`` is set but a multi-turn run trains
    eagerly (``train_compiled``); None when nothing is overridden."""
    if cfg.compile_train and multi_turn_env(cfg.env) and device.type == "cuda":
        return (
            f"compile_train=true is not applied with env={cfg.env}: the compiled backward "
            "fails on multi-turn batches (an inductor shape error at run time), so the "
            "training forward/backward runs eagerly; sampling stays compiled"
        )
    return None
