"""Sampling completions for GRPO rollouts: static KV cache + CUDA graphs, exact sampling.

Interface (stable; the trainer uses only this)::

    params = SamplingParams(max_new_tokens=128, eos_token_id=eos, pad_token_id=pad,
                            temperature=1.0, top_p=1.0, generator=None)
    completion_ids, completion_mask = sample(model, prompt_ids, prompt_mask, params)

- ``prompt_ids`` (B, P) LongTensor, LEFT-padded; ``prompt_mask`` (B, P) 1/True for real tokens.
  For GRPO pass each prompt G times (B = prompts x G, rows of a group adjacent).
- Returns ``completion_ids`` (B, N) LongTensor with N <= max_new_tokens (the longest row; shorter
  rows are right-padded with ``pad_token_id``) and ``completion_mask`` (B, N) bool: True for the
  sampled tokens up to AND including the first EOS of the row; False after it. A row that never
  emits EOS is all True (truncated at max_new_tokens).
- ``temperature == 0`` is greedy. Otherwise the distribution is HF ``generate``'s with
  ``top_k=None``: float32 logits / temperature, then top-p filtering exactly as transformers'
  ``TopPLogitsWarper`` (ascending sort, drop the tokens whose cumulative probability is
  <= 1 - top_p, always keep the most likely), then one categorical draw. The draw is made by
  inverse CDF from one uniform number per row and step (drawn up front from ``generator``), an
  exact sampler of the same distribution that can live inside a CUDA graph. No other logits
  processors (repetition penalty, min length...) are applied.
- ``generator``: a ``torch.Generator`` on the model's device for reproducible sampling.
- Log-probs are NOT returned: the trainer recomputes them with its training forward.

How it is fast (Qwen2/Qwen3/Llama/Mistral-shaped decoders, default-style RoPE, no sliding
window; else plain ``model.generate``): a small functional forward reuses the model's own
modules over a static KV cache ``(B, kv_heads, C, head_dim)`` per layer (views of one
allocation, ``trainer.kvcache``; C rounded up so similar batches share it); q, k and v come
from one product with a merged weight (``decoder.MergedQKV``, copied from the live weights
every call). Each distinct prompt is prefilled once, eagerly (about 8k prompt tokens per
forward); each decode step (forward, sampling, EOS bookkeeping) is one CUDA-graph replay over
static buffers, attending only to the filled slots rounded up to 128 (one graph per length),
and the host checks "all rows done" every few steps. Weights are read live, so optimizer
updates are seen without re-capture. ``keep_cache=False`` frees only the KV cache; the next
call replays the graphs if it comes back at the same address, else captures anew. On CPU
the same code runs eagerly (that is what the CPU tests exercise).
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F

from arbiter.trainer import decoder
from arbiter.trainer.kvcache import Bucket, capture, new_bucket
from arbiter.trainer.sampling import (
    SamplingParams,
    choose,
    completion_mask_from_ids,
    plain_generate,
    sampling_probs,
)

__all__ = ["Sampler", "SamplingParams", "completion_mask_from_ids", "sample", "sampling_probs"]

log = logging.getLogger(__name__)

_CAPACITY_ROUND = 64  # KV-cache capacity is rounded up to this many slots
_LENGTH_ROUND = 128  # a decode step attends to the filled cache slots rounded up to this
_MAX_BUCKETS = 4  # cached (batch, capacity, ...) graph buckets per model
_PREFILL_TOKENS = 8192  # prompt tokens per prefill forward (whole rows)


class Sampler:
    """Stateful sampler bound to one model; caches KV buffers and CUDA graphs across calls.

    ``use_cuda_graphs``: None = on for CUDA models. ``check_every``: decode steps between
    host checks for "every row has emitted EOS". ``compile``: torch.compile the decode step
    before capturing it (fewer, fused kernels): one decoder layer, which every layer runs, and
    the head with the draw, so a new shape costs one layer's compilation, not the model's;
    None = on for CUDA models, off on the CPU (where the sampler runs eagerly).
    ``keep_cache``: keep each bucket's KV cache and graphs for the next call of the same
    shape; False frees the cache when the call returns (the memory goes back to training).

    Exact shortcuts (off: as before them, for before/after; a GEMM may order its sums
    differently): ``length_round`` -- a step attends only to the cache's first S slots, S the
    filled length rounded up to this (0: the whole cache), one graph and static compilation
    per S (a dynamic S gave a 5-7x slower softmax); ``share_prompts`` -- each distinct prompt
    is prefilled once, its K/V copied to its duplicates; ``blocked_draw`` -- without top-p,
    ``sampling._draw``'s two-level inverse CDF, compiled into the step, instead of a
    full-vocabulary softmax and cumulative sum; ``merged_qkv`` -- one [hidden -> (H + 2 KVH)
    D] product per layer (``decoder.MergedQKV``, compute dtype, 176 MB at 1.5B, copied from
    the live weights every call); ``reuse_graphs`` -- ``keep_cache=False`` frees only the
    KV cache (one allocation, 5.6 GB at 1.5B) and keeps the graphs, their pool and the small
    static buffers, replayed next call if the cache comes back at the same address, else
    captured anew (``kvcache.Bucket.prepare``, ``graph_stats``; it comes back when nothing
    long-lived was allocated meanwhile: ``grpo.allocate_state`` before the first rollout).
    Off by default: ``group_attention`` -- rows in adjacent runs of G identical prompts
    (GRPO) get their prompts left-padded to the cache's first C - N slots, which a step reads
    once per group (``decoder.grouped_attention``; compiled, slower on an H100, in either
    cache layout: ``bench.trainer.decode_micro``). ``attention`` (decode steps): "eager"
    (default; HF's numerics) or "flex" / "sdpa" (one fused kernel,
    ``decoder.fused_attention``, float32 scores; no faster at 1.5B on an H200; a failed
    compile falls back to eager).

    The KV cache is sized from the batch actually sampled: its rows, and its longest prompt
    plus ``max_new_tokens`` rounded up to 64 slots. A graph is captured again whenever the
    weights' storage moved (FSDP2 gathers a sharded model into fresh memory per rollout) or
    the KV cache's did.
    """

    def __init__(
        self,
        model: Any,
        *,
        use_cuda_graphs: bool | None = None,
        check_every: int = 8,
        compile: bool | None = None,
        keep_cache: bool = True,
        length_round: int = _LENGTH_ROUND,
        share_prompts: bool = True,
        blocked_draw: bool = True,
        attention: str = "eager",
        reuse_graphs: bool = True,
        merged_qkv: bool = True,
        group_attention: bool = False,
    ) -> None:
        if attention not in decoder.ATTENTIONS:
            raise ValueError(f"attention {attention!r} not in {decoder.ATTENTIONS}")
        self.model = model
        self.check_every = check_every
        self.keep_cache = keep_cache
        self.length_round, self.share_prompts = length_round, share_prompts
        self.blocked_draw = blocked_draw
        self.reuse_graphs, self.merged_qkv = reuse_graphs, merged_qkv
        self.group_attention = group_attention
        self._qkv: dict[torch.dtype, decoder.MergedQKV] = {}  # compute dtype -> buffer
        self.graph_stats = {"reused": 0, "cache moved": 0, "weights moved": 0}
        self.blocked_draw_compiles = True  # False once compiling the draw has failed
        self.fast_reason = decoder.unsupported_reason(model)
        self.fast = self.fast_reason is None
        if not self.fast:
            log.info("sampler: plain generate (%s)", self.fast_reason)
        self.device = next(model.parameters()).device
        self.use_graphs = (
            self.device.type == "cuda" if use_cuda_graphs is None else bool(use_cuda_graphs)
        )
        self._buckets: OrderedDict[tuple[Any, ...], Bucket] = OrderedDict()
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self._pool: Any = None
        # compile=True: inductor fuses the decode step's small kernels (norms, rotary,
        # softmax) before the graph is captured. Compiled are ONE decoder layer
        # (``decoder.layer_step``, which every layer runs: a compilation per (cache, attended
        # length) shape costs one layer's, not the whole unrolled model's, whose 5 lengths per
        # cache size made a 7B rollout compile for minutes) and the head with the blocked draw
        # (``_head_draw``, one per batch); the full-width cumsum draw stays eager (inductor
        # 2.11 fails to generate code for the 32k-wide cumsum).
        self.compiled = self.device.type == "cuda" if compile is None else bool(compile)
        self._layer_fn: Any = None  # None: decoder.layer_step, eager
        self._head_draw: Any = _head_draw
        if self.compiled:
            if length_round:  # one compiled entry per attended length, temperature and cache
                limit = torch._dynamo.config.recompile_limit
                torch._dynamo.config.recompile_limit = max(limit, 128)
            self._layer_fn = torch.compile(decoder.layer_step, dynamic=False)
            self._head_draw = torch.compile(_head_draw, dynamic=False)
        self.attention = attention

    # ------------------------------------------------------------------ the decoder
    def _rope_tables(self, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self._rope is None or self._rope[0].shape[0] < length or self._rope[0].dtype != dtype:
            self._rope = decoder.rope_tables(self.model, max(length, 2048), dtype, self.device)
        return self._rope

    def _forward(
        self,
        ids: torch.Tensor,  # (B, T)
        pos: torch.Tensor,  # (B, T)
        bk: Bucket,
        mask: torch.Tensor,  # (B, T, S) bool over the first S cache slots
        write: Any,  # write(cache, new) stores new K or V (B, KVH, T, D) into the cache
        last_only: bool,
        head_fn: Any = None,
    ) -> torch.Tensor:
        return decoder.forward(self.model, ids, pos, bk.extra["rope"], bk.k_cache, bk.v_cache,
                               mask, write, last_only, self.attention, bk.extra["qkv"],
                               bk.extra["shared"], layer_fn=self._layer_fn,
                               head_fn=head_fn)  # fmt: skip

    def _forward_sample(
        self, bk: Bucket, mask: torch.Tensor, write: Any, u: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        """The decode step's forward, then the head and blocked draw (no top-p) together."""

        def head(model: Any, x: torch.Tensor) -> torch.Tensor:
            return self._head_draw(model, x, u, temperature)

        return self._forward(bk.tokens[:, None], bk.pos[:, None], bk, mask, write, False, head)

    def _fused(self, bk: Bucket) -> bool:
        """Whether the draw runs inside the (compiled) decode function."""
        return self.blocked_draw and self.blocked_draw_compiles and bk.key[4] >= 1.0

    # ------------------------------------------------------------------ buffers and graphs
    def _bucket(self, b: int, c: int, n: int, temperature: float, top_p: float, g: int) -> Bucket:
        dtype = cache_dtype = self.model.model.embed_tokens.weight.dtype
        if torch.is_autocast_enabled(self.device.type):  # e.g. fp32 master weights, bf16 autocast
            cache_dtype = torch.get_autocast_dtype(self.device.type)
        key = (b, c, n, float(temperature), float(top_p), cache_dtype, g)
        bk = self._buckets.get(key)
        if bk is not None:
            self._buckets.move_to_end(key)
            return bk
        while len(self._buckets) >= _MAX_BUCKETS:
            self._buckets.popitem(last=False)
        _, h_kv, d = decoder.dims(self.model)
        bk = new_bucket(key, layers=len(self.model.model.layers), rows=b, kv_heads=h_kv,
                        capacity=c, head_dim=d, new_tokens=n, cache_dtype=cache_dtype,
                        device=self.device, rope=self._rope_tables(c, dtype))  # fmt: skip
        bk.extra["shared"] = (g, c - n) if g > 1 else None  # rows per group, shared slots
        self._buckets[key] = bk
        return bk

    def _decode_step(self, bk: Bucket, s: int) -> None:
        """One token for every row, attending to the first ``s`` cache slots; all state lives
        in ``bk`` (so it can be graph-captured)."""
        temperature, top_p = bk.key[3], bk.key[4]
        bk.valid.index_fill_(1, bk.slot, True)

        def write(cache: torch.Tensor, new: torch.Tensor) -> None:
            cache.index_copy_(2, bk.slot, new.to(cache.dtype))

        mask = bk.valid[:, None, :s]
        u = bk.noise.index_select(0, bk.step).squeeze(0)
        if self._fused(bk):
            tok = self._forward_sample(bk, mask, write, u, temperature)
        else:
            logits = self._forward(
                bk.tokens[:, None], bk.pos[:, None], bk, mask, write, last_only=False
            )
            tok = choose(logits, u, temperature, top_p, blocked=self.blocked_draw)
        tok = torch.where(bk.done, bk.extra["pad_t"], tok)
        bk.out.index_copy_(1, bk.step, tok[:, None])
        bk.done |= tok == bk.extra["eos_t"]
        bk.tokens.copy_(tok)
        bk.pos += 1
        bk.slot += 1
        bk.step += 1

    def _capture_or_uncompile(self, bk: Bucket, s: int) -> None:
        """Capture the decode step; if compiling fails, draw eagerly, then run it eagerly."""
        try:
            self._capture(bk, s)
        except Exception as e:
            if not self.compiled:
                raise
            if self.attention != "eager":
                log.warning("sampler: the fused attention failed (%s); eager attention", e)
                self.attention = "eager"
            elif self._fused(bk):
                log.warning("sampler: compiling the draw failed (%s); drawing eagerly", e)
                self.blocked_draw_compiles = False
            else:
                log.warning("sampler: torch.compile failed (%s); capturing the eager step", e)
                self.compiled, self._layer_fn, self._head_draw = False, None, _head_draw
            self._capture_or_uncompile(bk, s)

    def _capture(self, bk: Bucket, s: int) -> None:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        capture(bk, s, self._decode_step, self._pool)

    # ------------------------------------------------------------------ public call
    @torch.no_grad()
    def __call__(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.fast:
            return plain_generate(self.model, prompt_ids, prompt_mask, params)
        dev_type = self.device.type
        ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if torch.is_autocast_enabled(dev_type):
            # Autocast's weight-cast cache must be off: a captured graph would otherwise read
            # the cached bf16 weight copies, which are freed when the caller's autocast exits
            # (stale memory, and optimizer updates unseen). Uncached, the casts are in the graph.
            dt = torch.get_autocast_dtype(dev_type)
            ctx = torch.autocast(dev_type, dtype=dt, cache_enabled=False)
        with ctx:
            return self._fast(prompt_ids, prompt_mask, params)

    def _fast(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device).bool()
        b, p = prompt_ids.shape
        n, eos, pad = params.max_new_tokens, params.eos_token_id, params.pad_token_id
        c = -(-(p + n) // _CAPACITY_ROUND) * _CAPACITY_ROUND
        temperature, top_p = float(params.temperature), float(params.top_p)
        g = decoder.group_rows(prompt_ids, prompt_mask) if self.group_attention else 1
        if g > 1:  # every prompt fills the slots [0, c - n), which a group's rows share
            prompt_ids = F.pad(prompt_ids, (c - n - p, 0), value=pad)
            prompt_mask, p = F.pad(prompt_mask, (c - n - p, 0), value=False), c - n
        bk = self._bucket(b, c, n, temperature, top_p, g)
        # decode step i (1..n-1) writes slot p+i-1 and attends to the first `lengths[i-1]`
        lengths = [
            min(c, -(-(p + i) // self.length_round) * self.length_round) if self.length_round else c
            for i in range(1, n)
        ]
        qkv = self._merged_qkv(bk.cache_dtype)
        bk.extra["qkv"] = None if qkv is None else qkv.layers
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        dropped = bk.prepare(0 if qkv is None else qkv.data_ptr(), weights)
        if dropped is not None:  # a fresh pool: the dropped graphs' one may be released
            self.graph_stats[dropped] += 1
            self._pool = None
            log.info("sampler: %s since the graphs were captured; capturing anew", dropped)
        elif bk.graphs:
            self.graph_stats["reused"] += 1
        if self.use_graphs:
            for s in sorted(set(lengths)):
                if s not in bk.graphs:
                    self._capture_or_uncompile(bk, s)
        bk.extra["eos_t"].fill_(eos), bk.extra["pad_t"].fill_(pad)
        logits = decoder.prefill(
            self.model, bk.extra["rope"], bk.k_cache, bk.v_cache, prompt_ids, prompt_mask,
            share=self.share_prompts, tokens_per_forward=_PREFILL_TOKENS, qkv=bk.extra["qkv"],
        )  # fmt: skip
        noise = torch.rand((n, b), generator=params.generator, device=self.device)
        bk.noise.copy_(noise)
        first = choose(logits, bk.noise[0], temperature, top_p, blocked=self.blocked_draw)
        bk.valid.zero_()
        bk.valid[:, :p] = prompt_mask
        bk.out.fill_(pad)
        bk.out[:, 0] = first
        bk.done.copy_(first == eos)
        bk.tokens.copy_(first)
        bk.pos.copy_(prompt_mask.long().sum(-1))
        bk.slot.fill_(p), bk.step.fill_(1)
        for i in range(1, n):
            if (i - 1) % self.check_every == 0 and bool(bk.done.all()):
                break
            graph = bk.graph(lengths[i - 1])
            if graph is not None:
                graph.replay()
            else:
                self._decode_step(bk, lengths[i - 1])
        ids = bk.out.clone()
        if not self.keep_cache:
            self.release(keep_graphs=self.reuse_graphs)
        cmask = completion_mask_from_ids(ids, eos)
        ids = ids.masked_fill(~cmask, pad)
        width = max(int(cmask.sum(-1).max().item()), 1)
        return ids[:, :width].contiguous(), cmask[:, :width].contiguous()

    def release(self, keep_graphs: bool = False) -> None:
        """Free every bucket's KV cache; with ``keep_graphs`` keep the rest (graphs, their
        memory pool, static buffers, merged q/k/v buffers) for the next call to reuse when the
        cache comes back at the same address; otherwise free everything (the next call
        allocates and captures anew)."""
        if keep_graphs:
            for bk in self._buckets.values():
                bk.free(graphs=False)
            return
        self._buckets.clear()
        self._qkv.clear()
        self._pool = None

    def _merged_qkv(self, dtype: torch.dtype) -> decoder.MergedQKV | None:
        """The merged q/k/v buffer in the compute dtype, refreshed from the live weights."""
        if not self.merged_qkv or not decoder.MergedQKV.supports(self.model):
            return None
        qkv = self._qkv.get(dtype)
        if qkv is None:
            qkv = self._qkv[dtype] = decoder.MergedQKV(self.model, dtype)
        qkv.refresh()
        return qkv


def _head_draw(model: Any, x: torch.Tensor, u: torch.Tensor, temperature: float) -> torch.Tensor:
    """The decode step's tail: final norm, head and blocked draw (``choose``, no top-p)."""
    return choose(decoder.logits(model, x), u, temperature, 1.0, blocked=True)


_SAMPLERS: dict[int, Sampler] = {}


def sample(
    model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample completions with the model's cached ``Sampler``; see the module docstring."""
    return sampler_for(model)(prompt_ids, prompt_mask, params)


def sampler_for(model: Any) -> Sampler:
    """The model's cached ``Sampler`` with default settings (one per live model)."""
    sampler = _SAMPLERS.get(id(model))
    if sampler is None or sampler.model is not model:
        sampler = _SAMPLERS[id(model)] = Sampler(model)
    return sampler
