"""GRPO maths: group advantages, the clipped surrogate with k3 KL, the optimizer.

Per-token log-probs come from ``trainer.logprobs``.

Shapes: ``S`` sequences (= groups x G), ``N`` completion tokens. ``loss_mask`` (S, N) is 1
on tokens the policy produced (action tokens) and 0 on padding and on environment
observation tokens, which are in the context but are not the policy's actions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """(S,) rewards with NaN for null/masked -> (S,) advantages.

    Per group: A_j = (r_j - mean) / (std + eps), mean and (unbiased) std over the group's
    non-null rewards only. Null rewards get A = 0; a group with < 2 non-null rewards gets 0
    throughout (no baseline to compare against).
    """
    r = rewards.view(-1, group_size).double()
    valid = ~torch.isnan(r)
    n = valid.sum(dim=1, keepdim=True)
    filled = torch.where(valid, r, torch.zeros_like(r))
    mean = filled.sum(dim=1, keepdim=True) / n.clamp(min=1)
    var = (torch.where(valid, r - mean, torch.zeros_like(r)) ** 2).sum(dim=1, keepdim=True) / (
        n - 1
    ).clamp(min=1)
    adv = r - mean
    if scale:
        std = var.sqrt()
        adv = torch.where(std > 0, adv / (std + eps), torch.zeros_like(adv))
    adv = torch.where(valid & (n >= 2), adv, torch.zeros_like(adv))
    return adv.view(-1).to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def group_std_is_zero(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(groups,) bool: all non-null rewards of the group equal (no learning signal)."""
    r = rewards.view(-1, group_size)
    valid = ~torch.isnan(r)
    hi = torch.where(valid, r, torch.full_like(r, -math.inf)).amax(dim=1)
    lo = torch.where(valid, r, torch.full_like(r, math.inf)).amin(dim=1)
    return (hi - lo <= 1e-12) | (valid.sum(dim=1) < 2)


@dataclass
class LossParts:
    loss: torch.Tensor  # scalar, this micro-batch's share of the batch loss
    pg_sum: torch.Tensor  # sum of masked per-token policy loss (for logging)
    kl_sum: torch.Tensor  # sum of masked per-token k3 KL
    clipped: torch.Tensor  # number of masked tokens where clipping is active
    ratio_sum: torch.Tensor


def grpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: str = "token_mean",
    norm: float | None = None,
) -> LossParts:
    """Clipped surrogate + beta * k3 KL, aggregated over (S, N) masked tokens.

    per_token = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high)) + beta * k3,
    ratio = exp(logp - old_logp), k3 = exp(ref - logp) - (ref - logp) - 1.

    ``agg="token_mean"``: sum over tokens / ``norm`` (default: this batch's token count);
    ``agg="seq_mean"``: sum over sequences of the per-sequence token mean / ``norm``
    (default: number of sequences). Pass ``norm`` = the whole batch's count when the batch
    is split into micro-batches, so the micro-batch losses add up to the batch loss.
    """
    keep = loss_mask.bool()
    mask = keep.to(logps.dtype)
    # masked positions (padding, observations) are zeroed with where, not multiplied, so
    # that whatever values they hold (even inf/nan) neither reach the loss nor the gradient
    zero = torch.zeros_like(logps)
    logps = torch.where(keep, logps, zero)
    old_logps = torch.where(keep, old_logps, zero)
    ratio = torch.exp(logps - old_logps)
    adv = advantages.unsqueeze(-1)  # (S, 1)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = torch.maximum(pg1, pg2)
    kl = torch.zeros_like(per_token)
    if beta > 0 and ref_logps is not None:
        d = torch.where(keep, ref_logps, zero) - logps
        kl = torch.exp(d) - d - 1
        per_token = per_token + beta * kl
    per_token = torch.where(keep, per_token, zero)
    if agg == "token_mean":
        total = per_token.sum()
        loss = total / (norm if norm is not None else mask.sum().clamp(min=1))
    elif agg == "seq_mean":
        lens = mask.sum(-1)
        seq = per_token.sum(-1) / lens.clamp(min=1)
        loss = seq.sum() / (norm if norm is not None else max(1, int((lens > 0).sum())))
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}")
    clipped = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
    return LossParts(
        loss=loss,
        pg_sum=torch.where(keep, torch.maximum(pg1, pg2), 0.0).sum().detach(),
        kl_sum=torch.where(keep, kl, 0.0).sum().detach(),
        clipped=(clipped & keep).sum().detach().to(mask.dtype),
        ratio_sum=torch.where(keep, ratio, 0.0).sum().detach(),
    )


def build_optimizer(
    model: torch.nn.Module,
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    warmup_steps: int,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over trainable parameters with linear warm-up, then constant."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = bool(params) and params[0].is_cuda
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused)
    warm = max(0, warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / (warm + 1)) if warm else 1.0
    )
    return opt, sched


@torch.no_grad()
def allocate_state(opt: torch.optim.Optimizer) -> None:
    """Create an Adam-family optimizer's state now for the parameters that have none, as
    its first step would (zero moments, step 0): one step at learning rate 0 in which only
    they have a gradient, zero, then their step counts reset. Nothing else changes, so the
    next real step is the one it would have been. Allocated before the first rollout, the
    state cannot take the memory the sampler's freed KV cache leaves during training, so
    the cache can come back at its address and the sampler can replay its CUDA graphs
    (``Sampler(reuse_graphs=True)``). A no-op once every parameter has state."""
    params = [p for g in opt.param_groups for p in g["params"]]
    new = {id(p) for p in params if not opt.state.get(p)}
    if not new:
        return
    lrs = [g["lr"] for g in opt.param_groups]
    grads = {id(p): p.grad for p in params}
    for p in params:  # the step sees only the new ones
        p.grad = torch.zeros_like(p) if id(p) in new else None
    for g in opt.param_groups:
        g["lr"] = 0.0
    try:
        opt.step()
    finally:
        for g, lr in zip(opt.param_groups, lrs, strict=True):
            g["lr"] = lr
        for p in params:
            p.grad = grads[id(p)]
    for p in params:
        step = opt.state[p].get("step") if id(p) in new else None
        if isinstance(step, torch.Tensor):
            step.zero_()
        elif step is not None:
            opt.state[p]["step"] = 0
