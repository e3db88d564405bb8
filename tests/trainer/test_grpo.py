"""Advantages and the GRPO loss against hand-computed values, masking included."""

from __future__ import annotations

import math

import pytest
import torch

from arbiter.trainer.grpo import (
    allocate_state,
    group_advantages,
    group_std_is_zero,
    grpo_loss,
)

NAN = math.nan
S3 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 1]


@pytest.mark.parametrize(
    ("rewards", "scale", "expected"),
    [
        # two groups of 4; the null (NaN) is left out of mean/std and gets 0
        (
            [1, 0, 1, NAN, 2, 2, 2, 2],
            True,
            [(1 / 3) / S3, (-2 / 3) / S3, (1 / 3) / S3, 0, 0, 0, 0, 0],
        ),
        # without std scaling: plain r - mean
        ([1, 0, 1, NAN, 0, 1, 2, 3], False, [1 / 3, -2 / 3, 1 / 3, 0, -1.5, -0.5, 0.5, 1.5]),
        # one non-null reward: no baseline, all zero; all null: all zero
        ([NAN, 5, NAN, NAN, NAN, NAN, NAN, NAN], True, [0] * 8),
        # masked responses don't move the others: [3, 1, null, null] -> mean 2, std sqrt(2)
        (
            [3, 1, NAN, NAN, 0, 0, 0, 1],
            True,
            [1 / math.sqrt(2), -1 / math.sqrt(2), 0, 0, -0.5, -0.5, -0.5, 1.5],
        ),
    ],
)
def test_group_advantages(rewards: list[float], scale: bool, expected: list[float]) -> None:
    adv = group_advantages(torch.tensor(rewards), 4, scale=scale, eps=0.0)
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)


def test_group_advantages_eps() -> None:
    # (r - mean) / (std + eps) with eps = 0.5: [1, 0, 1] std sqrt(1/3)
    adv = group_advantages(torch.tensor([1.0, 0.0, 1.0, NAN]), 4, eps=0.5)
    assert adv[1].item() == pytest.approx((-2 / 3) / (S3 + 0.5))


def test_zero_std_groups() -> None:
    r = torch.tensor([1.0, 1.0, NAN, 1.0, 0.0, 1.0, 0.0, 0.0, NAN, NAN, NAN, 2.0])
    assert group_std_is_zero(r, 4).tolist() == [True, False, True]


def _case() -> dict[str, torch.Tensor]:
    # S=2, N=3; seq 0 has A=+1, seq 1 has A=-1 and a padded last token
    return {
        "logps": torch.tensor([[0.0, math.log(1.5), math.log(0.5)], [math.log(0.9), 0.0, 0.0]]),
        "old_logps": torch.zeros(2, 3),
        "advantages": torch.tensor([1.0, -1.0]),
        "loss_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
    }


@pytest.mark.parametrize(
    ("kwargs", "expected_loss"),
    [
        # per token: seq0 ratios 1, 1.5, 0.5 -> -1, -1.2 (clipped), -0.5; seq1 ratios .9, 1 -> .9, 1
        ({"agg": "token_mean"}, (-1 - 1.2 - 0.5 + 0.9 + 1) / 5),
        # per sequence first: (-2.7 / 3 + 1.9 / 2) / 2
        ({"agg": "seq_mean"}, (-0.9 + 0.95) / 2),
        # a wider upper clip (DAPO clip-higher) lets 1.5 through: -1.5 instead of -1.2
        ({"agg": "token_mean", "eps_high": 0.6}, (-1 - 1.5 - 0.5 + 0.9 + 1) / 5),
        # k3 KL to ref = 0: exp(d) - d - 1 with d = -logp per unmasked token, times beta
        (
            {"agg": "token_mean", "beta": 0.1, "ref_logps": torch.zeros(2, 3)},
            (-0.8 + 0.1 * 0.3847348) / 5,
        ),
        # micro-batching: the caller passes the whole batch's token count as norm
        ({"agg": "token_mean", "norm": 10.0}, -0.8 / 10),
    ],
)
def test_grpo_loss(kwargs: dict[str, object], expected_loss: float) -> None:
    parts = grpo_loss(**_case(), **kwargs)  # type: ignore[arg-type]
    assert parts.loss.item() == pytest.approx(expected_loss, abs=1e-6)


def test_clip_fraction_and_kl_sum() -> None:
    parts = grpo_loss(**_case(), beta=0.1, ref_logps=torch.zeros(2, 3))  # type: ignore[arg-type]
    # only ratio 1.5 with A > 0 is past the clip range
    assert parts.clipped.item() == 1
    # 0.0721318 (d=-ln1.5) + 0.3068528 (d=ln2) + 0.0057506 (d=-ln.9)
    assert parts.kl_sum.item() == pytest.approx(0.3847352, abs=1e-5)


def test_masked_tokens_neither_count_nor_get_gradient() -> None:
    case = _case()
    base = grpo_loss(**case).loss.item()  # type: ignore[arg-type]
    # garbage at the masked position (padding / observation) changes nothing
    logps = case["logps"].clone()
    logps[1, 2] = float("inf")
    old = case["old_logps"].clone()
    old[1, 2] = float("nan")
    logps.requires_grad_(True)
    ref = torch.zeros(2, 3)
    ref[1, 2] = float("nan")
    parts = grpo_loss(logps, old, case["advantages"], case["loss_mask"], beta=0.1, ref_logps=ref)
    parts.loss.backward()
    assert logps.grad is not None
    assert logps.grad[1, 2].item() == 0.0
    assert torch.isfinite(logps.grad).all()
    assert grpo_loss(
        logps.detach(), old, case["advantages"], case["loss_mask"]
    ).loss.item() == pytest.approx(base)


def test_zero_advantage_gives_zero_policy_gradient() -> None:
    # a null reward -> A = 0 -> its tokens push nothing (without KL)
    logps = torch.zeros(1, 3, requires_grad=True)
    grpo_loss(logps, torch.zeros(1, 3), torch.zeros(1), torch.ones(1, 3)).loss.backward()
    assert logps.grad is not None and logps.grad.abs().sum().item() == 0.0


@pytest.mark.parametrize("fused", [False, True])
def test_optimizer_state_allocated_ahead_changes_no_step(fused: bool) -> None:
    """allocate_state creates AdamW's moments and step counts without moving a weight; the
    steps that follow equal those of an optimizer that made its state at its first step."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1,
                              fused=fused) for m in models]  # fmt: skip
    before = [p.clone() for p in models[1].parameters()]
    allocate_state(opts[1])
    for p, b in zip(models[1].parameters(), before, strict=True):
        assert torch.equal(p, b) and p.grad is None
        state = opts[1].state[p]
        assert float(state["step"]) == 0 and not state["exp_avg"].any()
    assert opts[1].param_groups[0]["lr"] == 1e-2
    for _ in range(3):
        grads = [torch.randn_like(p) for p in models[0].parameters()]
        for m, opt in zip(models, opts, strict=True):
            for p, g in zip(m.parameters(), grads, strict=True):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)
        assert torch.equal(opts[0].state[a]["exp_avg_sq"], opts[1].state[b]["exp_avg_sq"])


def test_optimizer_state_allocated_ahead_leaves_existing_state_alone() -> None:
    """Parameters that already have state (a resumed run, or one never given a gradient
    while others were) keep their moments and step counts; only the others get fresh state."""
    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    opt = torch.optim.AdamW([a, b], lr=1e-2)
    for _ in range(3):  # b never gets a gradient: it has no state
        a.grad = torch.randn(3)
        opt.step()
    a.grad = torch.randn(3)  # a gradient held across the call comes back untouched
    held, moments = a.grad.clone(), opt.state[a]["exp_avg"].clone()
    before = (a.detach().clone(), b.detach().clone())
    allocate_state(opt)
    assert float(opt.state[a]["step"]) == 3 and torch.equal(opt.state[a]["exp_avg"], moments)
    assert float(opt.state[b]["step"]) == 0 and not opt.state[b]["exp_avg"].any()
    assert torch.equal(a.grad, held) and b.grad is None
    assert torch.equal(a, before[0]) and torch.equal(b, before[1])
