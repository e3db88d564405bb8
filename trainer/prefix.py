"""The training forward with each distinct prompt of a micro-batch run once (shared prefix).

GRPO samples G completions of every prompt, and the trainer's micro-batches hold a group's rows
together. A causal model's hidden states over a prompt do not depend on what follows it, so the
plain forward computes the same prompt G times: at the seed's shape (GSM8K prompts of ~170
tokens, 512 new tokens, G=8) that is a fifth of the training tokens. Here a micro-batch's
tokens are the distinct prompts (``u`` rows, their shared left padding dropped) followed by the
completions (``rows x n``), and each decoder layer runs its norms, projections and MLP -- nearly
all of its FLOPs -- over those tokens once. Attention alone works on whole rows: each row's
queries, keys and values are its prompt's (gathered from the prompt tokens) followed by its
completion's, through the same causal kernel as the plain forward; a prompt token's output is
read from the first row of its prompt. The last prompt position's hidden state predicts each
row's first completion token. The result is the plain forward's up to floating-point rounding
(tests/trainer/test_prefix.py compares values and gradients): the same attention, the same
positions. A prompt token's gradient adds up over the rows that attend to it, as autograd does
through the gather.

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

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from arbiter.trainer import decoder, regional


@dataclass
class Plan:
    """A micro-batch as its distinct prompts and its completions."""

    prompt_ids: torch.Tensor  # (u, pp) left-padded, shared padding dropped
    comp_ids: torch.Tensor  # (rows, n)
    inverse: torch.Tensor  # (rows,) prompt of each row
    first: torch.Tensor  # (u,) first row of each prompt
    positions: torch.Tensor  # (u * pp + rows * n,) rotary position of every token
    mask: torch.Tensor | None  # (rows, 1, pp + n, pp + n) bool; None: causal, no padding


def plan(input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int) -> Plan | None:
    """``input_ids`` (rows, P + n) with ``attention_mask`` (left-padded prompts, then ``n``
    completion columns) as distinct prompts and completions; None when no two rows share a
    prompt."""
    rows, width = input_ids.shape
    p = width - n
    if rows < 2 or p < 1:
        return None
    dev = input_ids.device
    mask = attention_mask.bool()
    inverse, first = decoder.distinct_rows(input_ids[:, :p], mask[:, :p])
    if len(first) == rows:
        return None
    start = int(mask[:, :p].any(0).long().argmax())  # the left padding every row has
    mask, pp = mask[:, start:], p - start
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)  # as the plain forward's
    positions = torch.cat([pos[first, :pp].reshape(-1), pos[:, pp:].reshape(-1)])
    cmask = mask[:, pp:]
    right_padded = bool((cmask.long().diff(dim=-1) <= 0).all()) if n > 1 else True
    full = None
    if not (bool(mask[:, :pp].all()) and right_padded):
        length = pp + n
        causal = torch.ones(length, length, device=dev, dtype=torch.bool).tril()
        eye = torch.eye(length, device=dev, dtype=torch.bool)  # no query without a key
        full = ((causal[None] & mask[:, None, :]) | eye[None])[:, None]
    prompt_ids = input_ids[first][:, start:p]
    return Plan(prompt_ids, input_ids[:, p:], inverse, first, positions, full)


def hidden_states(model: Any, pl: Plan, compile: bool = False) -> torch.Tensor:
    """The final (normed) hidden states (rows, n, H) that predict each completion token, the
    first one from the last prompt position. ``model``: the causal LM (unwrapped)."""
    inner = model.model
    u, pp = pl.prompt_ids.shape
    rows, n = pl.comp_ids.shape
    ids = torch.cat([pl.prompt_ids.reshape(-1), pl.comp_ids.reshape(-1)])
    x = inner.embed_tokens(ids)  # (u * pp + rows * n, H)
    cos, sin = inner.rotary_emb(x[None], pl.positions[None])
    with regional.layers_swapped(inner.layers, _layer, compile):
        for layer in inner.layers:
            x = layer(x, cos[0], sin[0], pl.inverse, pl.first, pl.mask, u, pp, rows, n)
    last = x[: u * pp].view(u, pp, -1)[:, -1].index_select(0, pl.inverse)  # (rows, H)
    h = torch.cat([last[:, None], x[u * pp :].view(rows, n, -1)[:, :-1]], dim=1)
    return inner.norm(h)


def _layer(
    layer: Any,
    x: torch.Tensor,  # (T, H), the prompt stream's tokens first
    cos: torch.Tensor,  # (T, D)
    sin: torch.Tensor,
    inverse: torch.Tensor,
    first: torch.Tensor,
    mask: torch.Tensor | None,
    u: int,  # distinct prompts
    pp: int,  # prompt columns
    rows: int,
    n: int,  # completion columns
) -> torch.Tensor:
    """One decoder layer over the micro-batch's tokens (HF's layer: pre-norm attention, then
    MLP); attention over whole rows."""
    attn = layer.self_attn
    h_q, h_kv, d = attn.config.num_attention_heads, attn.config.num_key_value_heads, attn.head_dim
    hs = layer.input_layernorm(x)
    q = attn.q_proj(hs).view(-1, h_q, d)
    k = attn.k_proj(hs).view(-1, h_kv, d)
    v = attn.v_proj(hs).view(-1, h_kv, d)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    c, sn = cos[:, None], sin[:, None]
    q = q * c + decoder.rotate_half(q) * sn
    k = k * c + decoder.rotate_half(k) * sn
    tp = u * pp

    def rows_of(t: torch.Tensor) -> torch.Tensor:  # (T, heads, d) -> (rows, heads, pp + n, d)
        prompt = t[:tp].view(u, pp, -1, d).index_select(0, inverse)
        return torch.cat([prompt, t[tp:].view(rows, n, -1, d)], dim=1).transpose(1, 2)

    qr, kr, vr = rows_of(q), rows_of(k), rows_of(v)
    if mask is None:
        o = F.scaled_dot_product_attention(
            qr, kr, vr, is_causal=True, scale=attn.scaling, enable_gqa=True
        )
    else:  # as HF with a mask: key/value heads repeated for their query heads
        kr, vr = kr.repeat_interleave(h_q // h_kv, 1), vr.repeat_interleave(h_q // h_kv, 1)
        o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=attn.scaling)
    o = o.transpose(1, 2)  # (rows, pp + n, h_q, d)
    prompt_o = o.index_select(0, first)[:, :pp].reshape(tp, h_q * d)
    o = torch.cat([prompt_o, o[:, pp:].reshape(rows * n, h_q * d)])
    x = x + attn.o_proj(o)
    return x + layer.mlp(layer.post_attention_layernorm(x))


def supported(model: Any) -> bool:
    """Whether the shared-prefix forward can run ``model`` (the unwrapped causal LM)."""
    return decoder.unsupported_reason(model) is None
