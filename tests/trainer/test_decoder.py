"""arbiter.trainer.decoder's attentions on CPU: the fused decode attention (flex attention and
SDPA, run eagerly here) against the eager HF-numerics attention, on random inputs with
left padding and unfilled cache slots masked. The compiled kernels run on the lent GPU
(bench/trainer_sampler_probe.py)."""

from __future__ import annotations

import pytest
import torch

from arbiter.trainer.decoder import eager_attention, fused_attention

B, H, KVH, S, D = 4, 6, 2, 40, 16  # a head group of 3 (the 1.5B model's is 6: not a power of 2)


def _inputs(t: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q (B, H, t, D), keys/vals (B, KVH, S, D), mask (B, t, S): row r's prompt starts at slot
    pad[r] (left padding), its cache holds slots up to filled - t + i for query i."""
    g = torch.Generator().manual_seed(t)
    q, k, v = (
        torch.randn(B, h, n, D, generator=g).to(dtype) for h, n in ((H, t), (KVH, S), (KVH, S))
    )
    pad = torch.tensor([0, 3, 17, 9])[:, None, None]
    filled = 29  # slots >= filled are unwritten (garbage here: random values)
    slot = torch.arange(S)[None, None]
    last = filled - t + torch.arange(t)[None, :, None]  # query i's own slot
    mask = (slot >= pad) & (slot <= last)
    mask[1, :, 5] = False  # a hole inside a row (a masked real slot)
    return q, k, v, mask


def _eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bias = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    return eager_attention(q, k, v, bias[:, None, None], D**-0.5, torch.float32)


@pytest.mark.parametrize("kind", ["flex", "sdpa"])
@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fused_attention_equals_eager(kind: str, t: int, dtype: torch.dtype, tol: float) -> None:
    q, k, v, mask = _inputs(t, dtype)
    ref = _eager(q, k, v, mask)
    got = fused_attention(q, k, v, mask, D**-0.5, kind)
    assert got.shape == (B, H, t, D) and got.dtype == dtype
    torch.testing.assert_close(got.float(), ref, atol=tol, rtol=tol)
    # the check can fail: the same inputs with the masked slots attended differ by far more
    loose = fused_attention(q, k, v, torch.ones_like(mask), D**-0.5, kind)
    assert (loose.float() - ref).abs().max() > 20 * tol


def test_fused_attention_uses_its_own_kv_head() -> None:
    """Query head h reads KV head h // (H / KVH), as HF's repeat_kv: against a plain
    per-head reference with the KV heads repeated."""
    q, k, v, mask = _inputs(1, torch.float32)
    kr, vr = k.repeat_interleave(H // KVH, 1), v.repeat_interleave(H // KVH, 1)
    scores = (q @ kr.transpose(-1, -2)) * D**-0.5
    ref = scores.masked_fill(~mask[:, None], float("-inf")).softmax(-1) @ vr
    torch.testing.assert_close(fused_attention(q, k, v, mask, D**-0.5), ref)


def test_fused_attention_refuses_an_unknown_kind() -> None:
    q, k, v, mask = _inputs(1, torch.float32)
    with pytest.raises(ValueError, match="attention kind"):
        fused_attention(q, k, v, mask, D**-0.5, "eager")
