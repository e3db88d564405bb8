"""The training forward with each distinct prompt of a micro-batch run once (shared prefix).

GRPO samples G completions of every prompt, and the trainer's micro-batches hold a group's rows
together. A causal model's hidden states over a prompt do not depend on what follows it, so the
plain forward computes the same prompt G times: at the 1.5B setting (GSM8K prompts of ~170
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
    prompt_positions: torch.Tensor  # (u, pp) rotary position of every prompt token
    comp_positions: torch.Tensor  # (rows, n) and of every completion token
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
    cmask = mask[:, pp:]
    right_padded = bool((cmask.long().diff(dim=-1) <= 0).all()) if n > 1 else True
    full = None
    if not (bool(mask[:, :pp].all()) and right_padded):
        length = pp + n
        causal = torch.ones(length, length, device=dev, dtype=torch.bool).tril()
        eye = torch.eye(length, device=dev, dtype=torch.bool)  # no query without a key
        full = ((causal[None] & mask[:, None, :]) | eye[None])[:, None]
    prompt_ids = input_ids[first][:, start:p]
    return Plan(prompt_ids, input_ids[:, p:], inverse, first, pos[first, :pp], pos[:, pp:], full)


def hidden_states(model: Any, pl: Plan, compile: bool = False) -> torch.Tensor:
    """The final (normed) hidden states (rows, n, H) that predict each completion token, the
    first one from the last prompt position. ``model``: the causal LM (unwrapped)."""
    inner = model.model
    xp, xc = inner.embed_tokens(pl.prompt_ids), inner.embed_tokens(pl.comp_ids)
    cos_p, sin_p = inner.rotary_emb(xp, pl.prompt_positions)  # (u, pp, D)
    cos_c, sin_c = inner.rotary_emb(xc, pl.comp_positions)  # (rows, n, D)
    with regional.layers_swapped(inner.layers, _layer, compile):
        for layer in inner.layers:
            xp, xc = layer(xp, xc, cos_p, sin_p, cos_c, sin_c, pl.inverse, pl.first, pl.mask)
    last = xp[:, -1].index_select(0, pl.inverse)  # (rows, H)
    return inner.norm(torch.cat([last[:, None], xc[:, :-1]], dim=1))


def _layer(
    layer: Any,
    xp: torch.Tensor,  # (u, pp, H) the distinct prompts' tokens
    xc: torch.Tensor,  # (rows, n, H) the completions' tokens
    cos_p: torch.Tensor,  # (u, pp, D)
    sin_p: torch.Tensor,
    cos_c: torch.Tensor,  # (rows, n, D)
    sin_c: torch.Tensor,
    inverse: torch.Tensor,  # (rows,)
    first: torch.Tensor,  # (u,)
    mask: torch.Tensor | None,  # (rows, 1, pp + n, pp + n)
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer over the micro-batch's tokens (HF's layer: pre-norm attention, then
    MLP); attention over whole rows. Every size is a dimension of an argument (no integer
    arguments, no size computed from others), so a compiled layer with dynamic shapes has
    one symbol per dimension and no equations between them to solve."""
    attn = layer.self_attn
    h_q, h_kv, d = attn.config.num_attention_heads, attn.config.num_key_value_heads, attn.head_dim
    u, pp, hidden = xp.shape
    rows, n, _ = xc.shape
    # norms, projections and the MLP run over both streams' tokens at once
    x = torch.cat([xp.reshape(u * pp, hidden), xc.reshape(rows * n, hidden)])
    hs = layer.input_layernorm(x)
    q, k, v = attn.q_proj(hs), attn.k_proj(hs), attn.v_proj(hs)

    def rows_of(t: torch.Tensor, heads: int, rotary: bool) -> torch.Tensor:
        """(u * pp + rows * n, heads * d) -> (rows, heads, pp + n, d), rotated for q and k."""
        tp, tc = t[: u * pp].view(u, pp, heads, d), t[u * pp :].view(rows, n, heads, d)
        if rotary and hasattr(attn, "q_norm"):
            norm = attn.q_norm if heads == h_q else attn.k_norm
            tp, tc = norm(tp), norm(tc)
        if rotary:
            tp = tp * cos_p[:, :, None] + decoder.rotate_half(tp) * sin_p[:, :, None]
            tc = tc * cos_c[:, :, None] + decoder.rotate_half(tc) * sin_c[:, :, None]
        return torch.cat([tp.index_select(0, inverse), tc], dim=1).transpose(1, 2)

    qr, kr, vr = rows_of(q, h_q, True), rows_of(k, h_kv, True), rows_of(v, h_kv, False)
    if mask is None:
        o = F.scaled_dot_product_attention(
            qr, kr, vr, is_causal=True, scale=attn.scaling, enable_gqa=True
        )
    else:  # as HF with a mask: key/value heads repeated for their query heads
        kr, vr = kr.repeat_interleave(h_q // h_kv, 1), vr.repeat_interleave(h_q // h_kv, 1)
        o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=attn.scaling)
    o = o.transpose(1, 2)  # (rows, pp + n, h_q, d)
    prompt_o = o.index_select(0, first)[:, :pp].reshape(u * pp, h_q * d)
    o = torch.cat([prompt_o, o[:, pp:].reshape(rows * n, h_q * d)])
    x = x + attn.o_proj(o)
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x[: u * pp].view(u, pp, hidden), x[u * pp :].view(rows, n, hidden)


def supported(model: Any) -> bool:
    """Whether the shared-prefix forward can run ``model`` (the unwrapped causal LM)."""
    return decoder.unsupported_reason(model) is None
