"""arbiter.trainer.decoder's attentions on CPU: the fused decode attention (flex attention and
SDPA, run eagerly here) against the eager HF-numerics attention, on random inputs with
left padding and unfilled cache slots masked. The compiled kernels run on the lent GPU
(bench/trainer/sampler_probe.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from arbiter.trainer.decoder import (
    MergedQKV,
    eager_attention,
    fused_attention,
    group_rows,
    grouped_attention,
)

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


def _qwen(model_type: str) -> Any:
    """A small random Qwen2 (q/k/v biases) or Qwen3 (q_norm / k_norm, no biases)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, vocab_size=96, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=8, max_position_embeddings=256)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 else 0.1)
    return model.eval()


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_merged_qkv_buffer_follows_the_live_weights(model_type: str) -> None:
    model = _qwen(model_type)
    assert MergedQKV.supports(model)
    qkv = MergedQKV(model, torch.float32)
    qkv.refresh()
    a = model.model.layers[1].self_attn
    w, b = qkv.layers[1]
    assert torch.equal(w, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
    if model_type == "qwen2":
        assert b is not None
        assert torch.equal(b, torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
    else:
        assert b is None and hasattr(a, "q_norm")
    ptr = qkv.data_ptr()
    with torch.no_grad():
        a.v_proj.weight.add_(1.0)  # an optimizer step
    qkv.refresh()
    assert torch.equal(qkv.layers[1][0][-a.v_proj.out_features :], a.v_proj.weight)
    assert qkv.data_ptr() == ptr  # refreshed in place: graphs keep reading it


def test_merged_qkv_buffer_in_the_compute_dtype() -> None:
    """fp32 master weights under bf16 autocast: the buffer holds autocast's bf16 casts."""
    model = _qwen("qwen2")
    qkv = MergedQKV(model, torch.bfloat16)
    qkv.refresh()
    a = model.model.layers[0].self_attn
    w, b = qkv.layers[0]
    assert w.dtype == torch.bfloat16 and b is not None
    assert torch.equal(w[: a.q_proj.out_features], a.q_proj.weight.to(torch.bfloat16))
    assert torch.equal(b[-a.v_proj.out_features :], a.v_proj.bias.to(torch.bfloat16))


def test_merged_qkv_needs_plain_linear_projections() -> None:
    model = _qwen("qwen2")
    model.model.layers[1].self_attn.k_proj = torch.nn.Sequential()  # e.g. an adapter wrapper
    assert not MergedQKV.supports(model)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
@pytest.mark.parametrize("autocast", [False, True])
def test_merged_qkv_keeps_the_greedy_ids(model_type: str, autocast: bool) -> None:
    """The sampler with and without the merged product (Qwen3's q/k norms after the split;
    fp32, and fp32 weights under bf16 autocast): the same greedy ids; fp32 also HF's."""
    from arbiter.trainer.generation import Sampler, SamplingParams

    model = _qwen(model_type)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 96, (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[3, :6] = 0
    params = SamplingParams(40, -1, 0, temperature=0.0)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with ctx:
        got = [Sampler(model, merged_qkv=m)(ids, mask, params)[0] for m in (True, False)]
    assert torch.equal(got[0], got[1])
    assert len(set(got[0][0].tolist())) > 3, "test model should produce varied text"
    if not autocast:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40,
                             do_sample=False, eos_token_id=None, pad_token_id=0, top_k=None,
                             temperature=None, top_p=None)  # fmt: skip
        assert torch.equal(got[0], out[:, ids.shape[1] :])


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("kv_major", [False, True])
def test_grouped_attention_equals_eager(dtype: torch.dtype, tol: float, kv_major: bool) -> None:
    """Rows in groups of 2 share their first 24 slots (a group's prompt): reading them once per
    group gives eager's output; a row whose shared slots differed would not (they are read
    from the group's first row only). ``kv_major``: the cache laid out (KVH, B, S, D), the
    keys and values (B, KVH, S, D) views of it."""
    g = torch.Generator().manual_seed(0)
    shared = 24
    q = torch.randn(B, H, 1, D, generator=g).to(dtype)
    if kv_major:
        k, v = (torch.randn(KVH, B, S, D, generator=g).to(dtype).transpose(0, 1) for _ in "kv")
    else:
        k, v = (torch.randn(B, KVH, S, D, generator=g).to(dtype) for _ in range(2))
    k[1::2, :, :shared], v[1::2, :, :shared] = k[::2, :, :shared], v[::2, :, :shared]
    mask = torch.arange(S)[None, None] <= torch.tensor([30, 31, 35, 36])[:, None, None]
    mask[:, :, :5] = False  # left padding, the same in both rows of a group
    mask[2:, :, :9] = False
    bias = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    bias = bias[:, None, None]
    ref = eager_attention(q, k, v, bias, D**-0.5, dtype).float()
    got = grouped_attention(q, k, v, bias, D**-0.5, dtype, 2, shared).float()
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
    k[1, :, 7] += 1.0  # row 1's shared slot no longer its group's: not what it reads
    assert not torch.allclose(eager_attention(q, k, v, bias, D**-0.5, dtype).float(), got)


def test_group_rows_finds_adjacent_runs_of_a_prompt() -> None:
    a, b, c = ([x] * 3 for x in (1, 2, 3))
    ids = torch.tensor([a, a, a, b, b, b])
    mask = torch.ones_like(ids)
    assert group_rows(ids, mask) == 3
    assert group_rows(torch.tensor([a, a, a, a]), torch.ones(4, 3)) == 4
    assert group_rows(torch.tensor([a, a, b, b, a, a]), torch.ones(6, 3)) == 2
    assert group_rows(torch.tensor([a, a, a, a, b, b]), torch.ones(6, 3)) == 1  # runs of 4 and 2
    assert group_rows(torch.tensor([a, b, a, b]), torch.ones(4, 3)) == 1  # not adjacent
    assert group_rows(torch.tensor([a, b, c]), torch.ones(3, 3)) == 1
    mask[1, 0] = 0  # the same ids, another mask: another prompt
    assert group_rows(ids, mask) == 1
    pad = torch.tensor([[0, 5, 6], [9, 5, 6]])  # ids under the padding do not count
    assert group_rows(pad, torch.tensor([[0, 1, 1], [0, 1, 1]])) == 2


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_grouped_attention_keeps_the_samples(temperature: float) -> None:
    """The sampler on GRPO-style rows (groups of 3, prompts of several lengths) with and without
    group_attention: the same greedy ids (also HF's) and the same seeded samples."""
    from arbiter.trainer.generation import Sampler, SamplingParams

    model = _qwen("qwen2")
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 96, (3, 9), generator=g).repeat_interleave(3, 0)
    mask = torch.ones_like(ids)
    mask[3:6, :4] = 0  # left padding
    mask[6:, :2] = 0
    got = []
    for on in (True, False):
        gen = torch.Generator().manual_seed(3)
        params = SamplingParams(40, -1, 0, temperature=temperature, generator=gen)
        got.append(Sampler(model, group_attention=on)(ids, mask, params)[0])
    assert torch.equal(got[0], got[1])
    assert len(set(got[0][0].tolist())) > 3, "test model should produce varied text"
    if temperature == 0.0:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40,
                             do_sample=False, eos_token_id=None, pad_token_id=0, top_k=None,
                             temperature=None, top_p=None)  # fmt: skip
        assert torch.equal(got[0], out[:, ids.shape[1] :])
