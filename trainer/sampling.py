"""What to sample (``SamplingParams``) and the distribution ``trainer.generation`` draws from.

``SamplingParams`` is the one object that carries the sampling settings from the training
loop through the environment and the rollout to the sampler (as vLLM's does).
``sampling_probs`` is the distribution HF ``generate`` samples from (float32 logits /
temperature, then transformers' ``TopPLogitsWarper`` rules, no top-k); ``_choose`` draws
one token per row from it by inverse CDF with a uniform number given up front, so the draw
can live inside a CUDA graph. Kept apart from the sampler's cache and graph machinery so
that the distribution can be read (and tested) on its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How completions are drawn: length, distribution, stop and pad tokens, randomness.

    ``temperature == 0`` is greedy; otherwise float32 logits / temperature, then top-p as
    transformers' ``TopPLogitsWarper``. A row ends at its first ``eos_token_id`` (kept in the
    completion mask) or after ``max_new_tokens``. ``generator`` (on the model's device) makes
    the draw reproducible; ``None`` uses the global RNG.
    """

    max_new_tokens: int
    eos_token_id: int
    pad_token_id: int
    temperature: float = 1.0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, max_new_tokens: int, **kw: Any) -> SamplingParams:
        """Stop at the tokenizer's EOS and pad with its pad token."""
        return cls(max_new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id, **kw)


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """True up to and including the first ``eos_token_id`` of each row (all True if none)."""
    is_eos = (completion_ids == eos_token_id).int()
    # number of EOS strictly before position t; the token at t is kept iff that count is 0
    return (torch.cumsum(is_eos, dim=1) - is_eos) == 0


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution ``sample`` draws from, as HF computes it (for tests and docs)."""
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cum <= (1 - top_p)
        remove[..., -1:] = False
        remove = remove.scatter(-1, sorted_idx, remove)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores.softmax(dim=-1)


def _choose(
    logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float
) -> torch.Tensor:
    """One token per row from float32 ``logits`` (B, V); ``u`` (B,) uniform in [0, 1)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    scores = logits / temperature if temperature != 1.0 else logits
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        probs = sorted_logits.softmax(dim=-1)
        remove = probs.cumsum(dim=-1) <= (1 - top_p)
        remove[:, -1] = False
        cdf = probs.masked_fill(remove, 0.0).cumsum(dim=-1)
    else:
        sorted_idx = None
        cdf = scores.softmax(dim=-1).cumsum(dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(-1)
    j = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
    if sorted_idx is not None:
        j = sorted_idx.gather(-1, j)
    return j.squeeze(-1)


@contextlib.contextmanager
def _seeded(generator: torch.Generator | None, device: torch.device) -> Iterator[None]:
    """Run HF generate under the global RNG seeded from ``generator`` (fallback path only)."""
    if generator is None:
        yield
        return
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
