"""The shared-prefix training forward equals the plain one: values, entropies, gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arbiter.trainer import prefix
from arbiter.trainer.logprobs import completion_logprobs
from arbiter.trainer.setup import enable_gradient_checkpointing, load_model


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _batch(
    *, groups: int, g: int, p: int, n: int, pad: int = 0, eos_at: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``groups`` prompts x ``g`` rows (adjacent), left-padded by ``pad`` columns in every
    other group; row 1 ends ``eos_at`` columns early (right padding)."""
    torch.manual_seed(0)
    prompts = torch.randint(3, 200, (groups, p)).repeat_interleave(g, 0)
    ids = torch.cat([prompts, torch.randint(3, 200, (groups * g, n))], 1)
    attn = torch.ones_like(ids)
    for k in range(1, groups, 2):
        attn[k * g : (k + 1) * g, :pad] = 0
        ids[k * g : (k + 1) * g, :pad] = 0
    if eos_at:
        attn[1, -eos_at:] = 0
    return ids, attn


def test_plan_splits_the_distinct_prompts_and_keeps_the_plain_positions() -> None:
    ids, attn = _batch(groups=2, g=3, p=6, n=4, pad=2)
    pl = prefix.plan(ids, attn, 4)
    assert pl is not None
    assert pl.prompt_ids.shape == (2, 6)  # no padding shared by both prompts: none dropped
    assert sorted(pl.inverse.tolist()) == [0, 0, 0, 1, 1, 1]
    assert pl.mask is not None  # the second prompt is padded: an explicit mask
    plain = (attn.cumsum(-1) - 1).clamp(min=0)
    torch.testing.assert_close(pl.comp_positions, plain[:, 6:])
    first = [int(pl.inverse[r]) for r in (0, 3)]
    for row, u in zip((0, 3), first, strict=True):
        real = attn[row, :6].bool()
        torch.testing.assert_close(pl.prompt_positions[u][real], plain[row, :6][real])
    # one group without padding: the dense (causal kernels) case, the shared padding dropped
    ids, attn = _batch(groups=1, g=4, p=5, n=3)
    attn[:, :2] = 0
    pl = prefix.plan(ids, attn, 3)
    assert pl is not None and pl.prompt_ids.shape == (1, 3)
    assert pl.mask is None


def test_no_plan_when_no_prompt_repeats() -> None:
    ids, attn = _batch(groups=3, g=1, p=5, n=3)
    assert prefix.plan(ids, attn, 3) is None


@pytest.mark.parametrize(
    "layout",
    [
        dict(groups=1, g=4, p=7, n=6),  # one group, no padding: causal kernels
        dict(groups=2, g=3, p=8, n=5, pad=3, eos_at=2),  # padding, an early EOS: masks
        dict(groups=2, g=2, p=6, n=5, eos_at=3),  # right padding only: causal kernels
    ],
)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_logprobs_and_gradients_equal_the_plain_forward(
    tiny_model: Path, layout: dict[str, int], checkpointing: bool
) -> None:
    model = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    if checkpointing:
        enable_gradient_checkpointing(model)
    model.train()
    ids, attn = _batch(**layout)
    n = layout["n"]
    real = attn[:, -n:].bool()  # positions after a row's end carry no loss
    weights = torch.rand(real.shape)

    def run(shared: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        lp, ent = completion_logprobs(model, ids, attn, n, chunk_tokens=5, shared_prefix=shared,
                                      keep_logits=shared and checkpointing)  # fmt: skip
        (lp * weights * real).sum().backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        return lp.detach() * real, ent * real, grads

    plain, plain_ent, g_plain = run(False)
    got, ent, g_got = run(True)
    torch.testing.assert_close(got, plain)
    torch.testing.assert_close(ent, plain_ent)
    assert g_got.keys() == g_plain.keys() and len(g_plain) == len(list(model.parameters()))
    for k in g_plain:
        torch.testing.assert_close(g_got[k], g_plain[k], rtol=1e-4, atol=1e-6, msg=k)
    # the model's own forwards are back afterwards
    swapped = [m for m in (model, *model.model.layers) if "forward" in vars(m)]
    assert not swapped
    assert model(input_ids=ids, attention_mask=attn).logits.shape[:2] == ids.shape


def test_unsupported_models_and_the_plain_head_take_the_plain_forward(tiny_model: Path) -> None:
    model = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    ids, attn = _batch(groups=1, g=3, p=5, n=4)
    plain, _ = completion_logprobs(model, ids, attn, 4, chunk_tokens=0)
    full, _ = completion_logprobs(model, ids, attn, 4, chunk_tokens=0, shared_prefix=True)
    torch.testing.assert_close(full, plain)  # chunk_tokens=0: the plain way, shared or not
    model.config.model_type = "gpt2"  # not a shape the functional layer knows
    assert not prefix.supported(model)
    got, _ = completion_logprobs(model, ids, attn, 4, chunk_tokens=3, shared_prefix=True)
    torch.testing.assert_close(got, plain)
