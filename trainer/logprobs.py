"""Per-token log-probs of completions under a causal LM, without the full logits tensor.

The plain way, ``log_softmax(model(...).logits)[targets]``, holds ``[tokens, vocab]`` logits
in the model dtype and again in float32 (and their gradient): at Qwen2.5's 151,936-token
vocabulary, 16 sequences x 512 tokens are 5 GB per float32 copy. ``completion_logprobs``
instead has the model's output head return log-probs: it projects ``chunk_tokens`` hidden
states at a time, reduces each chunk to its (log-prob, entropy) pairs and keeps only the
chunk's log-sum-exp for backward, where the chunk's logits are recomputed (one matmul) and
turned straight into their gradient, ``g * (onehot - softmax)``. Peak memory of the head is
then ``chunk_tokens x vocab`` instead of ``tokens x vocab``; the values equal the plain way's
(tests/trainer/test_logprobs.py), in the spirit of Liger's fused linear cross-entropy.

``compile=True`` (the trainer passes it on a GPU, setting ``compile_train``) runs the decoder
layers and the head's element-wise maths through ``torch.compile`` (regional compilation: one
compiled layer serves every layer); the CPU runs them eagerly.

The head (and, compiled, each layer's forward) is swapped only for the duration of one
forward call, inside the model's own forward, so DDP's and FSDP2's hooks (gradient
reduction, parameter unsharding) see an ordinary forward and backward, and the sampler and
evaluation never run the compiled layers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from arbiter.trainer import prefix, regional


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[targets]: (S, N, V), (S, N) -> (S, N), in fp32."""
    logits = logits.float()
    return torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(
        logits, dim=-1
    )


@torch.no_grad()
def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """(..., V) -> (...) entropy of the sampling distribution (temperature 1), fp32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def completion_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int
) -> torch.Tensor:
    """Logits that predict the last ``n_completion`` tokens: (S, N, V) (the plain way).

    Position ids follow the attention mask (left padding), as generation used them.
    """
    out = model(**_forward_kwargs(input_ids, attention_mask, n_completion))
    return out.logits[:, :-1]


def completion_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    n_completion: int,
    *,
    chunk_tokens: int = 1024,
    compile: bool = False,
    shared_prefix: bool | prefix.Plan = False,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (S, N) fp32 of the last ``n_completion`` tokens of ``input_ids`` (S, P + N),
    with gradient, and their entropies (S, N) fp32, without gradient.

    ``chunk_tokens`` = 0 computes the whole logits tensor at once (the plain way).
    ``compile``: torch.compile the decoder layers and the chunked head (GPU only).
    ``shared_prefix``: rows with the same prompt run it once (``trainer.prefix``; chunked head
    and supported models only, else the plain forward); True plans it here, or pass the plan
    (``micro_batches`` makes them ahead). Values at completion positions after a row's last
    real token are then not the plain forward's (they carry no loss).
    ``keep_logits``: the chunked head keeps each chunk's logits (compute dtype) for backward
    instead of recomputing them (one product less per chunk; S x N x vocab values held)."""
    targets = input_ids[:, -n_completion:]
    plan = shared_prefix if isinstance(shared_prefix, prefix.Plan) else None
    if shared_prefix is True:
        plan = _plan(model, input_ids, attention_mask, n_completion, chunk_tokens)
    if plan is not None:
        return _shared_prefix_logprobs(model, plan, targets, chunk_tokens, compile, keep_logits)
    with _compiled_layers(model, compile):
        if chunk_tokens <= 0:
            logits = completion_logits(model, input_ids, attention_mask, n_completion)
            return token_logprobs(logits, targets), token_entropy(logits.detach())
        head = _bias_free_head(_unwrap(model))
        entropy: list[torch.Tensor] = []
        with _head_returns_logprobs(head, targets, chunk_tokens, entropy, compile, keep_logits):
            out = model(**_forward_kwargs(input_ids, attention_mask, n_completion))
    return out.logits, entropy[0]


def _shared_prefix_logprobs(
    model: Any,
    plan: prefix.Plan,
    targets: torch.Tensor,
    chunk_tokens: int,
    compile: bool,
    keep_logits: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``completion_logprobs`` through ``trainer.prefix``: the model's forward is swapped for
    one call (so a DDP or FSDP2 wrapper's hooks run as usual) for the two-stream forward and
    the chunked head."""
    inner = _unwrap(model)
    head = _bias_free_head(inner)

    def forward(*_: Any, **__: Any) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = prefix.hidden_states(inner, plan, compile)
        return chunked_logprobs(hidden, head.weight, targets, chunk_tokens, compile, keep_logits)

    inner.forward = forward
    try:
        logps, ent = model(plan.comp_ids)
    finally:
        del inner.forward
    return logps, ent


class MicroBatch(NamedTuple):
    rows: slice
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    n: int  # completion columns kept
    plan: prefix.Plan | None  # shared prefix


def micro_batches(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    size: int,
    *,
    trim: bool = True,
    shared_prefix: bool = False,
    chunk_tokens: int = 1024,
) -> list[MicroBatch]:
    """The batch's micro-batches of ``size`` rows, trimmed (``trim_spans``) and with their
    shared-prefix plans, all made before any of them runs: their host syncs would otherwise
    wait, every micro-batch, for the GPU work queued ahead."""
    n = loss_mask.shape[1]
    spans = trim_spans(attention_mask, loss_mask, size) if trim else []
    out = []
    for k, s in enumerate(range(0, len(input_ids), size)):
        sl = slice(s, s + size)
        ids, attn, keep = input_ids[sl], attention_mask[sl], n
        if trim:
            ids, attn, keep = trimmed(ids, attn, n, spans[k])
        plan = _plan(model, ids, attn, keep, chunk_tokens) if shared_prefix else None
        out.append(MicroBatch(sl, ids, attn, keep, plan))
    return out


def _plan(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int, chunk_tokens: int
) -> prefix.Plan | None:
    """The shared-prefix plan where it applies: a chunked head, a supported model, rows that
    share a prompt."""
    if chunk_tokens <= 0 or not prefix.supported(_unwrap(model)):
        return None
    return prefix.plan(input_ids, attention_mask, n)


def _bias_free_head(model: Any) -> Any:
    """The causal LM's output head; the chunked log-probs need it bias-free."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError(
            "chunked log-probs need a bias-free output head; set logprob_chunk_tokens=0"
        )
    return head


def trim_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Drop the columns no row needs: left padding that every row has, and completion
    columns after the last loss token of every row (a causal model's log-probs of earlier
    tokens do not depend on them). Returns the trimmed ids and mask, and the completion
    columns kept (>= 1); log-probs of the dropped completion columns are not computed."""
    (span,) = trim_spans(attention_mask, loss_mask, len(input_ids))
    return trimmed(input_ids, attention_mask, loss_mask.shape[1], span)


def trim_spans(
    attention_mask: torch.Tensor, loss_mask: torch.Tensor, micro_batch_size: int
) -> list[tuple[int, int]]:
    """``(first column, completion columns kept)`` of each micro-batch of
    ``micro_batch_size`` rows (see ``trim_padding``), with one host sync for all of them."""
    n = loss_mask.shape[1]
    p = attention_mask.shape[1] - n
    dev = attention_mask.device
    cols, comp = torch.arange(p, device=dev), torch.arange(1, n + 1, device=dev)
    spans = []
    for s in range(0, len(attention_mask), micro_batch_size):
        real = attention_mask[s : s + micro_batch_size, :p].bool().any(0)  # (P,)
        used = loss_mask[s : s + micro_batch_size].bool().any(0)  # (N,)
        first = torch.where(real, cols, p).amin() if p else cols.new_zeros(())
        spans.append(torch.stack([first, (used * comp).amax()]))
    return [(int(f), max(1, int(k))) for f, k in torch.stack(spans).tolist()]


def trimmed(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int, span: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The columns of ``span`` (from ``trim_spans``) of one micro-batch with ``n``
    completion columns: ids, mask, completion columns kept."""
    first, keep = span
    end = input_ids.shape[1] - n + keep
    return input_ids[:, first:end], attention_mask[:, first:end], keep


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_tokens: int,
    compile: bool = False,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden (S, N, H) @ weight (V, H)^T -> log-probs of ``targets`` (S, N) and entropy
    (S, N), ``chunk_tokens`` rows of logits at a time (kept for backward with
    ``keep_logits``, else recomputed there)."""
    S, N, H = hidden.shape
    h, t = hidden.reshape(S * N, H), targets.reshape(S * N)
    logps, ents = [], []
    for s in range(0, S * N, chunk_tokens):
        lp, ent = _HeadChunk.apply(h[s : s + chunk_tokens], weight, t[s : s + chunk_tokens],
                                   compile, keep_logits)  # fmt: skip
        logps.append(lp)
        ents.append(ent)
    # a copy, not a view: FSDP2 warns of views returned from a sharded module's forward
    return torch.cat(logps).view(S, N).clone(), torch.cat(ents).view(S, N)


def _chunk_stats(
    logits: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(c, V) logits -> log-prob of ``t``, entropy, log-sum-exp; each (c,) fp32."""
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    z = lf - lse[:, None]
    ent = -(z.exp() * z).sum(-1)
    return z.gather(-1, t[:, None]).squeeze(-1), ent, lse


def _chunk_grad(
    logits: torch.Tensor, lse: torch.Tensor, t: torch.Tensor, g: torch.Tensor
) -> torch.Tensor:
    """Gradient of sum(g * logp[t]) w.r.t. the logits: g * (onehot(t) - softmax), in the
    logits' dtype."""
    p = torch.exp(logits.float() - lse[:, None])
    hit = torch.arange(logits.shape[-1], device=logits.device)[None] == t[:, None]
    return (torch.where(hit, 1.0 - p, -p) * g[:, None]).to(logits.dtype)


def _maybe_compiled(fn: Callable[..., Any], compile: bool) -> Callable[..., Any]:
    return regional.compiled(fn) if compile else fn


class _HeadChunk(torch.autograd.Function):
    """One chunk of the head: logits = h @ W^T reduced to (log-prob, entropy); backward
    recomputes the logits (or reads them, kept) and forms their gradient directly (no fp32
    logits kept)."""

    @staticmethod
    def forward(
        ctx: Any,
        h: torch.Tensor,
        weight: torch.Tensor,
        t: torch.Tensor,
        compile: bool,
        keep_logits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(h, weight)  # (c, V), in the autocast dtype when autocast is on
        logp, ent, lse = _maybe_compiled(_chunk_stats, compile)(logits, t)
        ctx.save_for_backward(h, weight, t, lse, *([logits] if keep_logits else []))
        ctx.dtype, ctx.compile = logits.dtype, compile
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(
        ctx: Any, g: torch.Tensor | None, _g_ent: Any
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        h, weight, t, lse, *kept = ctx.saved_tensors
        if g is None:
            return None, None, None, None, None
        w = weight.to(ctx.dtype)  # autocast does not reach backward: cast as forward did
        hc = h.to(ctx.dtype)
        logits = kept[0] if kept else F.linear(hc, w)
        gl = _maybe_compiled(_chunk_grad, ctx.compile)(logits, lse, t, g.float())
        gh = (gl @ w).to(h.dtype) if ctx.needs_input_grad[0] else None
        gw = (gl.t() @ hc).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None


@contextlib.contextmanager
def _head_returns_logprobs(
    head: Any,
    targets: torch.Tensor,
    chunk_tokens: int,
    entropy: list[torch.Tensor],
    compile: bool,
    keep_logits: bool,
) -> Iterator[None]:
    """Make ``head`` (the LM head, a bias-free Linear) map hidden states (S, N + 1, H) to
    the log-probs (S, N) of ``targets`` for one call; the entropies go to ``entropy``."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        logps, ent = chunked_logprobs(
            hidden[:, :-1], head.weight, targets, chunk_tokens, compile, keep_logits
        )
        entropy.append(ent)
        return logps

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


@contextlib.contextmanager
def _compiled_layers(model: Any, compile: bool) -> Iterator[None]:
    """Run each decoder layer's forward through torch.compile for one call (``regional``)."""
    layers = getattr(getattr(_unwrap(model), "model", None), "layers", None) if compile else None
    if not layers:
        yield
        return
    with regional.layers_swapped(layers, _layer_forward, True):
        yield


def _layer_forward(layer: Any, *args: Any, **kwargs: Any) -> Any:
    return type(layer).forward(layer, *args, **kwargs)


def _forward_kwargs(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int
) -> dict[str, Any]:
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids,
        logits_to_keep=n_completion + 1,
        use_cache=False,
    )


def _unwrap(model: Any) -> Any:
    """The model inside a DDP wrapper (FSDP2 shards in place: no wrapper)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
