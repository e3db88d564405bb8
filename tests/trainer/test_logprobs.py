"""Chunked log-probs equal the plain full-logits computation: values, entropies, gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arbiter.trainer.logprobs import (
    chunked_logprobs,
    completion_logits,
    completion_logprobs,
    token_entropy,
    token_logprobs,
)
from arbiter.trainer.setup import load_model


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize(
    "chunk",
    [
        1,  # one token per chunk
        7,  # chunks that do not divide the token count (a short last chunk)
        64,  # one chunk holds everything (S x N = 30)
    ],
)
@pytest.mark.parametrize("keep_logits", [False, True])
def test_chunked_head_equals_full_logits(chunk: int, keep_logits: bool) -> None:
    torch.manual_seed(0)
    S, N, H, V = 3, 10, 16, 50
    hidden = torch.randn(S, N, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    targets = torch.randint(0, V, (S, N))
    logits = hidden @ weight.T
    full, full_ent = token_logprobs(logits, targets), token_entropy(logits)
    got, ent = chunked_logprobs(hidden, weight, targets, chunk, keep_logits=keep_logits)
    torch.testing.assert_close(got, full)
    torch.testing.assert_close(ent, full_ent)
    w = torch.randn(S, N)  # any downstream loss
    g_full = torch.autograd.grad((full * w).sum(), (hidden, weight))
    g_got = torch.autograd.grad((got * w).sum(), (hidden, weight))
    for a, b in zip(g_got, g_full, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("keep_logits", [False, True])
def test_the_head_keeps_its_logits_for_backward_only_when_asked(keep_logits: bool) -> None:
    """keep_logits trades memory for the backward's head product: each chunk's (c, V) logits
    are saved for backward (else only the hidden states, the weight and per-token values)."""
    torch.manual_seed(0)
    S, N, H, V, chunk = 2, 8, 16, 50, 6
    hidden = torch.randn(S, N, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        got, _ = chunked_logprobs(hidden, weight, torch.randint(0, V, (S, N)), chunk,
                                  keep_logits=keep_logits)  # fmt: skip
    logits_saved = [s for s in saved if len(s) == 2 and s[1] == V and s[0] <= chunk]
    assert len(logits_saved) == (3 if keep_logits else 0)  # 16 tokens: chunks of 6, 6, 4
    got.sum().backward()  # and backward runs from them
    assert hidden.grad is not None and weight.grad is not None


def test_model_logprobs_and_gradients_match_the_plain_way(tiny_model: Path) -> None:
    """Through the real model (tied embeddings: the head's weight is the embedding's), with
    left padding: chunked and full give the same log-probs and the same parameter grads."""
    model = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (4, 14))
    attn = torch.ones_like(ids)
    attn[1, :3] = 0  # left padding
    N = 6
    mask = torch.rand(4, N) > 0.3

    def grads(
        chunk: int, keep: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logps, ent = completion_logprobs(model, ids, attn, N, chunk_tokens=chunk, keep_logits=keep)
        (logps * mask).sum().backward()
        return logps.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}

    full, full_ent, g_full = grads(0)
    plain = token_logprobs(completion_logits(model, ids, attn, N), ids[:, -N:])
    torch.testing.assert_close(full, plain.detach())
    for keep in (False, True):  # the chunk's logits recomputed in backward, or kept
        got, ent, g_got = grads(5, keep)
        torch.testing.assert_close(got, full)
        torch.testing.assert_close(ent, full_ent)
        assert g_got.keys() == g_full.keys()
        for n in g_full:
            torch.testing.assert_close(g_got[n], g_full[n], rtol=1e-4, atol=1e-6, msg=n)
    # the head is the model's own again afterwards
    out = model(input_ids=ids, attention_mask=attn).logits
    assert out.shape == (4, 14, model.config.vocab_size)
