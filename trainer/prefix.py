"""The training forward with each distinct prompt of a micro-batch run once (shared prefix).

GRPO samples G completions of every prompt, and the trainer's micro-batches hold a group's rows
together. A causal model's hidden states over a prompt do not depend on what follows it, so the
plain forward computes the same prompt G times: at the seed's shape (GSM8K prompts of ~170
tokens, 512 new tokens, G=8) that is a fifth of the training tokens. Here a micro-batch runs as
two streams of tokens through each decoder layer:

- the distinct prompts (``u`` rows, their shared left padding dropped), attending causally to
  themselves;
- the completions (``rows x n``), attending to their own prompt's keys and values (gathered per
  row from the prompt stream) and causally to their own completion.

Norms, projections and the MLP take both streams' tokens as one batch; the last prompt position's
hidden state predicts each row's first completion token. The result is the plain forward's, up
to floating-point rounding (tests/trainer/test_prefix.py compares values and gradients): the
same attention sets, the same positions. Gradients of the prompt tokens add up over the rows
that attend to them, as autograd does through the gather.

Positions after a row's last real token (right padding after EOS) attend to the whole row
instead of skipping the padding when the micro-batch has no other padding: their values are
never used (they carry no loss), and the padding-free case can use the causal flash kernels.

Supported where the sampler's functional decoder is (``decoder.unsupported_reason``): Qwen2,
Qwen3, Llama and Mistral-shaped decoders without sliding windows. Each layer runs through its own
``__call__`` (its forward swapped for one call), so DDP's and FSDP2's hooks see an ordinary
forward; ``compile`` compiles the layer function (regional), with gradient checkpointing inside
it, as ``trainer.logprobs`` does for the plain forward.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.utils.checkpoint import checkpoint

from arbiter.trainer import decoder


@dataclass
class Plan:
    """A micro-batch split into its distinct prompts and its completions."""

    prompt_ids: torch.Tensor  # (u, pp) left-padded, shared padding dropped
    comp_ids: torch.Tensor  # (rows, n)
    inverse: torch.Tensor  # (rows,) prompt row of each completion row
    positions: torch.Tensor  # (u * pp + rows * n,) rotary position of every token
    prompt_mask: torch.Tensor | None  # (u, 1, pp, pp) bool; None: no padding (causal)
    comp_mask: torch.Tensor | None  # (rows, 1, n, pp + n) bool; None: causal lower right


def plan(input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int) -> Plan | None:
    """The two streams of ``input_ids`` (rows, P + n) with ``attention_mask`` (left-padded
    prompts, then ``n`` completion columns); None when no two rows share a prompt."""
    rows, width = input_ids.shape
    p = width - n
    if rows < 2 or p < 1:
        return None
    mask = attention_mask.bool()
    pmask, cmask = mask[:, :p], mask[:, p:]
    key = input_ids[:, :p].masked_fill(~pmask, -1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    u = uniq.shape[0]
    if u == rows:
        return None
    first = torch.full((u,), rows, device=input_ids.device, dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(rows, device=input_ids.device), "amin")
    pmask = pmask[first]
    start = int(pmask.any(0).long().argmax())  # the padding every distinct prompt has
    pmask, prompt_ids = pmask[:, start:], input_ids[first][:, start:p]
    pp = p - start
    plen = pmask.sum(-1)  # (u,) real prompt tokens
    pos_p = (pmask.long().cumsum(-1) - 1).clamp(min=0)
    pos_c = plen[inverse][:, None] + cmask.long().cumsum(-1) - 1
    positions = torch.cat([pos_p.reshape(-1), pos_c.clamp(min=0).reshape(-1)])
    prefix_only = bool((cmask.long().diff(dim=-1) <= 0).all()) if n > 1 else True
    dense = bool(pmask.all()) and prefix_only
    prompt_mask = comp_mask = None
    if not dense:
        dev = input_ids.device
        causal_p = torch.ones(pp, pp, device=dev, dtype=torch.bool).tril()
        eye_p = torch.eye(pp, device=dev, dtype=torch.bool)
        prompt_mask = ((causal_p[None] & pmask[:, None, :]) | eye_p[None])[:, None]
        causal_c = torch.ones(n, n, device=dev, dtype=torch.bool).tril()
        eye_c = torch.eye(n, device=dev, dtype=torch.bool)
        own = (causal_c[None] & cmask[:, None, :]) | eye_c[None]  # (rows, n, n)
        theirs = pmask[inverse][:, None, :].expand(rows, n, pp)
        comp_mask = torch.cat([theirs, own], dim=-1)[:, None]
    return Plan(prompt_ids, input_ids[:, p:], inverse, positions, prompt_mask, comp_mask)


def hidden_states(model: Any, pl: Plan, compile: bool = False) -> torch.Tensor:
    """The final (normed) hidden states (rows, n, H) that predict each completion token, the
    first one from the last prompt position. ``model``: the causal LM (unwrapped)."""
    inner = model.model
    u, pp = pl.prompt_ids.shape
    rows, n = pl.comp_ids.shape
    ids = torch.cat([pl.prompt_ids.reshape(-1), pl.comp_ids.reshape(-1)])
    x = inner.embed_tokens(ids)  # (u * pp + rows * n, H)
    cos, sin = inner.rotary_emb(x[None], pl.positions[None])
    with _layers_swapped(inner.layers, compile):
        for layer in inner.layers:
            x = layer(x, cos[0], sin[0], pl.inverse, pl.prompt_mask, pl.comp_mask, u, pp, rows, n)
    last = x[: u * pp].view(u, pp, -1)[:, -1].index_select(0, pl.inverse)  # (rows, H)
    h = torch.cat([last[:, None], x[u * pp :].view(rows, n, -1)[:, :-1]], dim=1)
    return inner.norm(h)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _layer(
    layer: Any,
    x: torch.Tensor,  # (T, H), the prompt stream's tokens first
    cos: torch.Tensor,  # (T, D)
    sin: torch.Tensor,
    inverse: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    comp_mask: torch.Tensor | None,
    u: int,  # distinct prompts
    pp: int,  # prompt columns
    rows: int,
    n: int,  # completion columns
) -> torch.Tensor:
    """One decoder layer over both streams (HF's layer: pre-norm attention, then MLP)."""
    attn = layer.self_attn
    h_q, h_kv, d = attn.config.num_attention_heads, attn.config.num_key_value_heads, attn.head_dim
    hs = layer.input_layernorm(x)
    q = attn.q_proj(hs).view(-1, h_q, d)
    k = attn.k_proj(hs).view(-1, h_kv, d)
    v = attn.v_proj(hs).view(-1, h_kv, d)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    c, sn = cos[:, None], sin[:, None]
    q = q * c + _rotate_half(q) * sn
    k = k * c + _rotate_half(k) * sn
    tp = u * pp

    def heads(t: torch.Tensor, b: int, length: int) -> torch.Tensor:
        return t.view(b, length, -1, d).transpose(1, 2)  # (b, heads, length, d)

    qp, kp, vp = (heads(t[:tp], u, pp) for t in (q, k, v))
    qc, kc, vc = (heads(t[tp:], rows, n) for t in (q, k, v))
    if prompt_mask is None:
        op = F.scaled_dot_product_attention(
            qp, kp, vp, is_causal=True, scale=attn.scaling, enable_gqa=True
        )
    else:
        kr, vr = _repeat(h_q // h_kv, kp, vp)
        op = F.scaled_dot_product_attention(qp, kr, vr, attn_mask=prompt_mask, scale=attn.scaling)
    keys = torch.cat([kp.index_select(0, inverse), kc], dim=2)  # (rows, h_kv, pp + n, d)
    vals = torch.cat([vp.index_select(0, inverse), vc], dim=2)
    keys, vals = _repeat(h_q // h_kv, keys, vals)
    mask = causal_lower_right(n, pp + n) if comp_mask is None else comp_mask
    oc = F.scaled_dot_product_attention(qc, keys, vals, attn_mask=mask, scale=attn.scaling)
    o = torch.cat([op.transpose(1, 2).reshape(tp, -1), oc.transpose(1, 2).reshape(-1, h_q * d)])
    x = x + attn.o_proj(o)
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _repeat(group: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Key/value heads repeated for their query heads (the kernels that take a mask or a
    lower-right causal bias want equal head counts)."""
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def _layer_checkpointed(layer: Any, *args: Any) -> torch.Tensor:
    if not (layer.training and torch.is_grad_enabled()):
        return _layer(layer, *args)
    return checkpoint(functools.partial(_layer, layer), *args, use_reentrant=False)


_COMPILED: dict[bool, Any] = {}


@contextlib.contextmanager
def _layers_swapped(layers: Any, compile: bool) -> Iterator[None]:
    """Each layer's forward is ``_layer`` (checkpointed where the layer is set to gradient
    checkpointing) for one call; compiled once for every layer when ``compile``."""
    ckpt = [bool(getattr(layer, "gradient_checkpointing", False)) for layer in layers]
    for layer, c in zip(layers, ckpt, strict=True):
        fn: Any = _layer_checkpointed if c else _layer
        if compile:
            if c not in _COMPILED:
                _COMPILED[c] = torch.compile(fn)
            fn = _COMPILED[c]
        layer.forward = functools.partial(fn, layer)
        if c:
            layer.gradient_checkpointing = False
    try:
        yield
    finally:
        for layer, c in zip(layers, ckpt, strict=True):
            del layer.forward
            if c:
                layer.gradient_checkpointing = True


def supported(model: Any) -> bool:
    """Whether the shared-prefix forward can run ``model`` (the unwrapped causal LM)."""
    return decoder.unsupported_reason(model) is None
