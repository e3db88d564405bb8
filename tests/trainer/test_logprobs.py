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
def test_chunked_head_equals_full_logits(chunk: int) -> None:
    torch.manual_seed(0)
    S, N, H, V = 3, 10, 16, 50
    hidden = torch.randn(S, N, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    targets = torch.randint(0, V, (S, N))
    logits = hidden @ weight.T
    full, full_ent = token_logprobs(logits, targets), token_entropy(logits)
    got, ent = chunked_logprobs(hidden, weight, targets, chunk)
    torch.testing.assert_close(got, full)
    torch.testing.assert_close(ent, full_ent)
    w = torch.randn(S, N)  # any downstream loss
    g_full = torch.autograd.grad((full * w).sum(), (hidden, weight))
    g_got = torch.autograd.grad((got * w).sum(), (hidden, weight))
    for a, b in zip(g_got, g_full, strict=True):
        torch.testing.assert_close(a, b)


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

    def grads(chunk: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logps, ent = completion_logprobs(model, ids, attn, N, chunk_tokens=chunk)
        (logps * mask).sum().backward()
        return logps.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()}

    full, full_ent, g_full = grads(0)
    plain = token_logprobs(completion_logits(model, ids, attn, N), ids[:, -N:])
    torch.testing.assert_close(full, plain.detach())
    got, ent, g_got = grads(5)
    torch.testing.assert_close(got, full)
    torch.testing.assert_close(ent, full_ent)
    assert g_got.keys() == g_full.keys()
    for n in g_full:
        torch.testing.assert_close(g_got[n], g_full[n], rtol=1e-4, atol=1e-6, msg=n)
    # the head is the model's own again afterwards
    out = model(input_ids=ids, attention_mask=attn).logits
    assert out.shape == (4, 14, model.config.vocab_size)
