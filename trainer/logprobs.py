"""Per-token log-probs of completions under a causal LM, without the full logits tensor.

The plain way, ``log_softmax(model(...).logits)[targets]``, holds ``[tokens, vocab]`` logits
in the model dtype and again in float32 (and their gradient): at Qwen2.5's 151,936-token
vocabulary, 16 sequences x 512 tokens are 5 GB per float32 copy. ``completion_logprobs``
instead has the model's output head return log-probs: it projects ``chunk_tokens`` hidden
states at a time, reduces each chunk to its (log-prob, entropy) pairs, and keeps no chunk
logits for backward (each chunk runs under activation checkpointing, so its logits are
recomputed, one chunk at a time, when the gradient flows). Peak memory of the head is then
``chunk_tokens x vocab`` instead of ``tokens x vocab``; the values equal the plain way's
(tests/trainer/test_logprobs.py), in the spirit of Liger's fused linear cross-entropy.

The head is swapped only for the duration of one forward call, inside the model's own
forward, so DDP's and FSDP2's hooks (gradient reduction, parameter unsharding) see an
ordinary forward and backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (S, N) fp32 of the last ``n_completion`` tokens of ``input_ids`` (S, P + N),
    with gradient, and their entropies (S, N) fp32, without gradient.

    ``chunk_tokens`` = 0 computes the whole logits tensor at once (the plain way)."""
    targets = input_ids[:, -n_completion:]
    if chunk_tokens <= 0:
        logits = completion_logits(model, input_ids, attention_mask, n_completion)
        return token_logprobs(logits, targets), token_entropy(logits.detach())
    head = _unwrap(model).get_output_embeddings()
    entropy: list[torch.Tensor] = []
    with _head_returns_logprobs(head, targets, chunk_tokens, entropy):
        out = model(**_forward_kwargs(input_ids, attention_mask, n_completion))
    return out.logits, entropy[0]


def chunked_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden (S, N, H) @ weight (V, H)^T -> log-probs of ``targets`` (S, N) and entropy
    (S, N), ``chunk_tokens`` rows of logits at a time."""
    S, N, H = hidden.shape
    h, t = hidden.reshape(S * N, H), targets.reshape(S * N)
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    logps, ents = [], []
    for s in range(0, S * N, chunk_tokens):
        args = (h[s : s + chunk_tokens], weight, t[s : s + chunk_tokens])
        lp, ent = checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args)
        logps.append(lp)
        ents.append(ent)
    # a copy, not a view: FSDP2 warns of views returned from a sharded module's forward
    return torch.cat(logps).view(S, N).clone(), torch.cat(ents).view(S, N)


def _chunk(
    h: torch.Tensor, weight: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(h, weight)  # (c, V), in the autocast dtype when autocast is on
    return token_logprobs(logits, t), token_entropy(logits.detach())


@contextlib.contextmanager
def _head_returns_logprobs(
    head: Any, targets: torch.Tensor, chunk_tokens: int, entropy: list[torch.Tensor]
) -> Iterator[None]:
    """Make ``head`` (the LM head, a bias-free Linear) map hidden states (S, N + 1, H) to
    the log-probs (S, N) of ``targets`` for one call; the entropies go to ``entropy``."""
    if getattr(head, "bias", None) is not None:
        raise ValueError(
            "chunked log-probs need a bias-free output head; set logprob_chunk_tokens=0"
        )

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        logps, ent = chunked_logprobs(hidden[:, :-1], head.weight, targets, chunk_tokens)
        entropy.append(ent)
        return logps

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


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
