"""A functional forward of Qwen2/Qwen3/Llama/Mistral-shaped decoders over a static KV cache.

Used by ``trainer.generation.Sampler`` (``prefill`` for the prompts, ``forward`` for both
the prompts and each decode step): it reuses the model's own modules (norms,
projections, MLP, embeddings, rotary tables) and reads the live parameters, so optimizer
updates are seen by captured CUDA graphs without re-capture. Numerics follow HF's eager
attention (scores in the model dtype, softmax in float32: ``eager_attention``, which
materialises the (B, heads, T, S) scores). A decode step (T == 1) may instead attend with one
fused kernel, ``fused_attention`` (``forward(attention="flex" | "sdpa")``): each KV head's G
query heads become G query rows of that head, so flex attention's decoding kernel (which wants
a power-of-two head group) reads each row's K and V once; scores stay in float32 there (no
rounding to the model dtype), so greedy ids may part from the eager path's after a while, as
bf16 rounding does. Prefill (T > 1) always uses the eager attention. At the 1.5B decode
shape on an H200 the fused kernel was no faster than the eager path's cuBLAS products (see
bench/results/experiments/trainer_notes.md), so the sampler's default stays eager.
``forward(qkv=...)`` computes each layer's q, k and v with one product over a ``MergedQKV``
buffer (the three projections' weights side by side, refreshed from the live parameters by
the sampler before each call) instead of three: the same sums per output, in one GEMM.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

ATTENTIONS = ("eager", "flex", "sdpa")  # forward(attention=...); the last two only at T == 1
# flex decoding's tile settings: torch 2.11's sm90 default (2 warps, 1 stage) streamed the
# 1.5B decode shape's K/V at 2.75 TB/s on an H200, these at 3.37 (bench.trainer.flex_micro)
FLEX_KERNEL_OPTIONS = {"num_stages": 2, "num_warps": 4}
SUPPORTED_TYPES = {"qwen2", "qwen3", "llama", "mistral"}
POSITION_FREE_ROPE = {"default", "linear", "llama3", "yarn"}


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def unsupported_reason(model: Any) -> str | None:
    """Why the fast path cannot run this model (None: it can)."""
    cfg = getattr(model, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in SUPPORTED_TYPES:
        return f"model_type {mtype!r} not in {sorted(SUPPORTED_TYPES)}"
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return "non-full attention layers"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
    if rope_type not in POSITION_FREE_ROPE:
        return f"rope_type {rope_type!r}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "no .model.layers / .model.rotary_emb"
    return None


def dims(model: Any) -> tuple[int, int, int]:
    """(query heads, key/value heads, head dim)."""
    attn = model.model.layers[0].self_attn
    cfg = model.config
    return int(cfg.num_attention_heads), int(cfg.num_key_value_heads), int(attn.head_dim)


def rope_tables(
    model: Any, n: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (n, head_dim) for positions 0..n-1, from the model's own rotary module."""
    pos = torch.arange(n, device=device)[None]
    dummy = torch.zeros(1, device=device, dtype=dtype)
    cos, sin = model.model.rotary_emb(dummy, pos)
    return cos[0].to(dtype).contiguous(), sin[0].to(dtype).contiguous()


def eager_attention(
    q: torch.Tensor,  # (B, H, T, D)
    keys: torch.Tensor,  # (B, KVH, S, D)
    vals: torch.Tensor,
    bias: torch.Tensor,  # (B, 1, 1, T, S) float32: 0, or the float32 minimum for masked slots
    scale: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """(B, H, T, D) in ``dtype``, HF eager attention's numerics: scores in the cache dtype,
    softmax in float32, probabilities in ``dtype``."""
    b, h_q, t, d = q.shape
    h_kv, s = keys.shape[1], keys.shape[2]
    group = h_q // h_kv
    qg = q.reshape(b, h_kv, group * t, d)
    scores = torch.matmul(qg.to(keys.dtype), keys.transpose(-1, -2)) * scale
    scores = scores.view(b, h_kv, group, t, s).float() + bias
    probs = scores.softmax(dim=-1).to(dtype).view(b, h_kv, group * t, s)
    return torch.matmul(probs, vals.to(probs.dtype)).view(b, h_q, t, d)


def grouped_attention(
    q: torch.Tensor,  # (B, H, 1, D)
    keys: torch.Tensor,  # (B, KVH, S, D)
    vals: torch.Tensor,
    bias: torch.Tensor,  # (B, 1, 1, 1, S) float32
    scale: float,
    dtype: torch.dtype,
    rows: int,  # G: rows per group, adjacent
    shared: int,  # the first slots, holding the same K/V in every row of a group
) -> torch.Tensor:
    """``eager_attention`` for one decode token when rows come in groups of ``rows`` (GRPO's G
    samples of a prompt, adjacent) whose first ``shared`` cache slots hold the same keys and
    values: those slots are read once per group, from its first row, and the group's queries
    meet them in one product (G x query heads rows instead of the query heads alone); the
    rest as ``eager_attention``. Same numerics (scores in the cache dtype, one float32 softmax
    over all slots), except that the probabilities' product with the values is two products
    added. Works in (KVH, B) order: over a cache laid out ``(KVH, B, C, D)`` a group's slots
    are one strided batch, read in place; over the sampler's ``(B, KVH, C, D)`` they are
    copied first. Slower than ``eager_attention`` in both layouts at 1.5B on an H100
    (``bench.trainer.decode_micro``)."""
    b, h_q, t, d = q.shape
    h_kv, s = keys.shape[1], keys.shape[2]
    hg, u = h_q // h_kv, b // rows
    kt, vt = keys.transpose(0, 1), vals.transpose(0, 1)  # (KVH, B, S, D)
    qk = q.reshape(b, h_kv, hg, d).transpose(0, 1).to(keys.dtype)  # (KVH, B, hg, D)
    s_shared = torch.matmul(qk.reshape(h_kv, u, rows * hg, d), kt[:, ::rows, :shared].mT)
    s_own = torch.matmul(qk, kt[:, :, shared:].mT)  # (KVH, B, hg, S - shared)
    scores = torch.cat([s_shared.view(h_kv, b, hg, shared), s_own], dim=-1) * scale
    probs = (scores.float() + bias.view(1, b, 1, s)).softmax(dim=-1).to(dtype)
    p_shared = probs[..., :shared].reshape(h_kv, u, rows * hg, shared)
    o = torch.matmul(p_shared, vt[:, ::rows, :shared].to(dtype)).view(h_kv, b, hg, d)
    o = o + torch.matmul(probs[..., shared:], vt[:, :, shared:].to(dtype))
    return o.transpose(0, 1).reshape(b, h_q, t, d)


def group_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> int:
    """G when the rows come in adjacent runs of G >= 2 identical prompts (GRPO's layout; two
    adjacent runs may hold the same prompt), else 1. One host sync."""
    b = prompt_ids.shape[0]
    if b < 2:
        return 1
    key = prompt_ids.masked_fill(~prompt_mask.bool(), -1)
    same = (key[1:] == key[:-1]).all(-1).cpu()  # row i + 1 repeats row i
    g = int(same.long().argmin()) + 1 if not bool(same.all()) else b
    inside = (torch.arange(1, b) % g) != 0  # the pairs inside a run of g
    if g < 2 or b % g or not bool(same[inside].all()):
        return 1
    return g


def fused_attention(
    q: torch.Tensor,  # (B, H, T, D)
    keys: torch.Tensor,  # (B, KVH, S, D)
    vals: torch.Tensor,
    mask: torch.Tensor,  # (B, T, S) bool: the slot may be attended
    scale: float,
    kind: str = "flex",
) -> torch.Tensor:
    """(B, H, T, D) in the cache dtype, by one fused kernel (flex attention or SDPA) when
    compiled on CUDA; eagerly (CPU) both materialise the scores. Every query must see at least
    one slot. The G = H / KVH query heads of a KV head are G * T query rows of that head."""
    b, h_q, t, d = q.shape
    h_kv = keys.shape[1]
    group = h_q // h_kv
    qg = q.reshape(b, h_kv, group * t, d).to(keys.dtype)  # row g * T + i: head g, token i
    if kind == "sdpa":
        m = mask[:, None] if t == 1 else mask.repeat(1, group, 1)[:, None]
        o = F.scaled_dot_product_attention(qg, keys, vals.to(keys.dtype), attn_mask=m, scale=scale)
        return o.reshape(b, h_q, t, d)
    if kind != "flex":
        raise ValueError(f"attention kind {kind!r} not in ('flex', 'sdpa')")
    neg = float("-inf")

    def keep(score: Any, bi: Any, hi: Any, qi: Any, kv: Any) -> Any:
        return torch.where(mask[bi, 0 if t == 1 else qi % t, kv], score, neg)

    o = flex_attention(qg, keys, vals.to(keys.dtype), score_mod=keep, scale=scale,
                       kernel_options=cast(Any, dict(FLEX_KERNEL_OPTIONS)))  # fmt: skip
    assert isinstance(o, torch.Tensor)
    return o.reshape(b, h_q, t, d)


class MergedQKV:
    """Per layer, the q, k and v projections' weights (and biases) side by side in one
    persistent buffer, ``cat((q_proj.weight, k_proj.weight, v_proj.weight))`` of shape
    ((H + 2 KVH) D, hidden): one product per layer instead of three small ones. ``dtype`` is
    the compute dtype (autocast's when on: the cast autocast would make of each weight).
    ``refresh`` copies the live parameters in (outside any CUDA graph; graphs read the
    buffer at its fixed address). Memory: layers x (H + 2 KVH) D x hidden elements (176 MB
    of bf16 at Qwen2.5-1.5B). ``layers[l]`` is (weight, bias or None) for ``forward(qkv=)``.
    """

    def __init__(self, model: Any, dtype: torch.dtype) -> None:
        attns = [layer.self_attn for layer in model.model.layers]
        projs = [(a.q_proj, a.k_proj, a.v_proj) for a in attns]
        a0 = projs[0]
        rows, hidden = sum(p.out_features for p in a0), a0[0].in_features
        has_bias = any(p.bias is not None for ps in projs for p in ps)
        dev = a0[0].weight.device
        self.weight = torch.zeros(len(projs), rows, hidden, device=dev, dtype=dtype)
        self.bias = torch.zeros(len(projs), rows, device=dev, dtype=dtype) if has_bias else None
        self.layers: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._dst: list[torch.Tensor] = []
        self._src: list[Any] = []  # (module, attribute name): read the live parameter each time
        for li, ps in enumerate(projs):
            w, b = self.weight[li], None if self.bias is None else self.bias[li]
            self.layers.append((w, b))
            start = 0
            for p in ps:
                end = start + p.out_features
                self._dst.append(w[start:end])
                self._src.append((p, "weight"))
                if b is not None and p.bias is not None:
                    self._dst.append(b[start:end])
                    self._src.append((p, "bias"))
                start = end

    @staticmethod
    def supports(model: Any) -> bool:
        """Plain ``nn.Linear`` q/k/v projections of one shape in every layer."""
        shapes = set()
        for layer in model.model.layers:
            a = layer.self_attn
            ps: list[Any] = [getattr(a, n, None) for n in ("q_proj", "k_proj", "v_proj")]
            if not all(isinstance(p, torch.nn.Linear) for p in ps):
                return False
            shapes.add(tuple((p.out_features, p.in_features, p.bias is None) for p in ps))
        return len(shapes) == 1

    def refresh(self) -> None:
        """Copy the live parameters in (cast to the buffer's dtype)."""
        with torch.no_grad():
            torch._foreach_copy_(self._dst, [getattr(m, n) for m, n in self._src])

    def data_ptr(self) -> int:
        return self.weight.data_ptr()


def forward(
    model: Any,
    ids: torch.Tensor,  # (B, T)
    pos: torch.Tensor,  # (B, T)
    rope: tuple[torch.Tensor, torch.Tensor],
    k_cache: list[torch.Tensor],  # per layer (B, KVH, C, D)
    v_cache: list[torch.Tensor],
    mask: torch.Tensor,  # (B, T, S) bool over the first S cache slots
    write: Any,  # write(cache, new) stores new K or V (B, KVH, T, D) into the cache
    last_only: bool,
    attention: str = "eager",  # one of ATTENTIONS; "flex" and "sdpa" apply only when T == 1
    qkv: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None,  # MergedQKV.layers
    shared: tuple[int, int] | None = None,  # (G, slots) for grouped_attention
    *,
    layer_fn: Any = None,  # runs each layer as ``layer_step`` does (e.g. it, compiled)
    head_fn: Any = None,  # (model, x (B, 1, hidden)) -> the step's result; default: logits
) -> Any:
    """Logits (B, V) float32 of the last position; K/V of the new tokens written to the cache.
    With ``qkv`` each layer's q, k and v come from one product with its merged weight (the
    model's own q_norm / k_norm still apply to the split q and k). With ``shared`` a one-token
    step's eager attention reads the slots a group's rows share once per group
    (``grouped_attention``). Every layer runs ``layer_fn`` (default ``layer_step``): the
    sampler compiles that one function, shared by all layers, instead of the whole step
    (one small compilation per shape rather than one of every layer unrolled)."""
    inner = model.model
    cos_t, sin_t = rope
    cos = cos_t[pos].unsqueeze(1)  # (B, 1, T, D)
    sin = sin_t[pos].unsqueeze(1)
    neg = torch.finfo(torch.float32).min  # (the fused path leaves the bias unused)
    bias = torch.zeros(mask.shape, device=ids.device, dtype=torch.float32)
    bias = bias.masked_fill(~mask, neg)[:, None, None]  # (B, 1, 1, T, S)
    x = inner.embed_tokens(ids)
    run, heads = layer_fn or layer_step, dims(model)
    for li, layer in enumerate(inner.layers):
        x = run(layer, x, cos, sin, bias, mask, k_cache[li], v_cache[li], write,
                None if qkv is None else qkv[li], heads, attention, shared)  # fmt: skip
    if last_only:
        x = x[:, -1:]
    return (head_fn or logits)(model, x)


def logits(model: Any, x: torch.Tensor) -> torch.Tensor:
    """(B, V) float32 logits of the last position of ``x`` (B, T, hidden)."""
    return model.lm_head(model.model.norm(x))[:, -1].float()


def layer_step(
    layer: Any,
    x: torch.Tensor,  # (B, T, hidden)
    cos: torch.Tensor,  # (B, 1, T, D)
    sin: torch.Tensor,
    bias: torch.Tensor,  # (B, 1, 1, T, S) float32
    mask: torch.Tensor,  # (B, T, S) bool
    k_cache: torch.Tensor,  # this layer's (B, KVH, C, D)
    v_cache: torch.Tensor,
    write: Any,
    qkv: tuple[torch.Tensor, torch.Tensor | None] | None,  # this layer's MergedQKV entry
    heads: tuple[int, int, int],  # (query heads, key/value heads, head dim)
    attention: str = "eager",
    shared: tuple[int, int] | None = None,
) -> torch.Tensor:
    """One decoder layer over the cache (``forward``'s body): x after the layer."""
    h_q, h_kv, d = heads
    b, t, _ = x.shape
    s = mask.shape[-1]
    attn = layer.self_attn
    hs = layer.input_layernorm(x)
    if qkv is None:
        q, k, v = attn.q_proj(hs), attn.k_proj(hs), attn.v_proj(hs)
    else:
        q, k, v = F.linear(hs, *qkv).split((h_q * d, h_kv * d, h_kv * d), -1)
    q, k, v = q.view(b, t, h_q, d), k.view(b, t, h_kv, d), v.view(b, t, h_kv, d)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    write(k_cache, k)
    write(v_cache, v)
    keys = k_cache[:, :, :s]  # (B, KVH, S, D)
    vals = v_cache[:, :, :s]
    if attention != "eager" and t == 1:
        o = fused_attention(q, keys, vals, mask, attn.scaling, attention).to(x.dtype)
    elif shared is not None and t == 1:
        o = grouped_attention(q, keys, vals, bias, attn.scaling, x.dtype, *shared)
    else:
        o = eager_attention(q, keys, vals, bias, attn.scaling, x.dtype)
    o = o.transpose(1, 2).reshape(b, t, h_q * d)  # (B, H, T, D) -> (B, T, H * D)
    x = x + attn.o_proj(o)
    return x + layer.mlp(layer.post_attention_layernorm(x))


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of ``ids`` (B, P), a row being its tokens where ``mask`` is set:
    ``inverse`` (B,), the distinct row of each row, and ``first`` (U,), the first row of each
    distinct one. One host sync (the count U)."""
    key = ids.masked_fill(~mask.bool(), -1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((uniq.shape[0],), len(ids), device=ids.device, dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(ids), device=ids.device), "amin")
    return inverse, first


def prefill(
    model: Any,
    rope: tuple[torch.Tensor, torch.Tensor],
    k_cache: list[torch.Tensor],  # per layer (B, KVH, C, D)
    v_cache: list[torch.Tensor],
    prompt_ids: torch.Tensor,  # (B, P) left-padded
    prompt_mask: torch.Tensor,  # (B, P) bool
    *,
    share: bool,
    tokens_per_forward: int,
    qkv: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None,  # MergedQKV.layers
) -> torch.Tensor:
    """Prompt K/V into slots [0, P) of every row's cache; logits (B, V) float32 of each row's
    last prompt position. Rows go in chunks of about ``tokens_per_forward`` prompt tokens (the
    MLP's activations of the whole batch's prompts would sit on top of the full cache). With
    ``share`` each distinct prompt (its real tokens at their places) runs once and its K/V and
    logits are copied to its duplicates (GRPO's G copies of a prompt)."""
    b, p = prompt_ids.shape
    dev = prompt_ids.device
    pos = (prompt_mask.long().cumsum(-1) - 1).clamp_(min=0)
    inverse = None
    if share and b > 1:
        inverse, first = distinct_rows(prompt_ids, prompt_mask)
        if len(first) < b:
            prompt_ids, prompt_mask, pos = prompt_ids[first], prompt_mask[first], pos[first]
        else:
            inverse = None
    u = prompt_ids.shape[0]
    causal = torch.ones(p, p, device=dev, dtype=torch.bool).tril_()
    mask = causal[None] & prompt_mask[:, None, :]

    def write_prefix(cache: torch.Tensor, new: torch.Tensor) -> None:
        cache[:, :, :p].copy_(new.to(cache.dtype))

    step = max(1, tokens_per_forward // max(p, 1))
    parts = []
    for r in range(0, u, step):
        sl = slice(r, min(r + step, u))
        kc, vc = [k[sl] for k in k_cache], [v[sl] for v in v_cache]  # row views
        parts.append(forward(model, prompt_ids[sl], pos[sl], rope, kc, vc, mask[sl],
                             write_prefix, last_only=True, qkv=qkv))  # fmt: skip
    logits = torch.cat(parts)
    if inverse is None:
        return logits
    for cache in (*k_cache, *v_cache):  # rows [0, u) hold the distinct prompts
        cache[:, :, :p] = cache[:u, :, :p].index_select(0, inverse)
    return logits.index_select(0, inverse)
