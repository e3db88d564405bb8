"""What to sample (``SamplingParams``) and the distribution ``trainer.generation`` draws from.

``SamplingParams`` is the one object that carries the sampling settings from the training
loop through the environment and the rollout to the sampler (as vLLM's does).
``sampling_probs`` is the distribution HF ``generate`` samples from (float32 logits /
temperature, then transformers' ``TopPLogitsWarper`` rules, no top-k). ``choose`` draws one
token per row from it by inverse CDF with a uniform number given up front, so the draw can
live inside a CUDA graph: without top-p by ``_draw``, a two-level inverse CDF (pick a block
of the vocabulary by its mass, then the token inside it), which reads the logits once when
compiled; with top-p by ``_choose``, the sorted full-width cumulative sum it needs anyway.
Kept apart from the sampler's cache and graph machinery so that the distribution can be
read (and tested) on its own; ``plain_generate`` is the same contract through HF
``generate``, for models the fast path does not cover.
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


def choose(
    logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float, blocked: bool = True
) -> torch.Tensor:
    """One token per row: greedy, else ``_draw`` (no top-p, ``blocked``) or ``_choose``."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    if blocked and top_p >= 1.0:
        return _draw(logits, u, temperature)
    return _choose(logits, u, temperature, top_p)


def block_size(vocab: int) -> int:
    """Width of ``_draw``'s vocabulary blocks: a divisor of ``vocab`` in [512, 2048], the
    nearest to 1024 (151,936 = 128 x 1,187), else 1,024 with a shorter last block."""
    if vocab < 1024:
        return vocab
    divisors = [d for d in range(512, 2049) if vocab % d == 0]
    return min(divisors, key=lambda d: abs(d - 1024)) if divisors else 1024


def _first_above(cum: torch.Tensor, target: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose inclusive ``cum`` exceeds ``target`` (B, 1), never past
    the last ``positive`` entry (float rounding can leave the total at or below target)."""
    idx = torch.arange(cum.shape[-1], device=cum.device).expand_as(cum)
    first = (cum <= target).sum(-1, keepdim=True)
    last = torch.where(positive, idx, 0).amax(-1, keepdim=True)
    return torch.minimum(first, last)


def _draw(
    logits: torch.Tensor, u: torch.Tensor, temperature: float, block: int | None = None
) -> torch.Tensor:
    """Inverse-CDF draw from softmax(logits / temperature) in two levels, exact as ``_choose``.

    The vocabulary is cut into blocks; each block's mass is sum(exp(x - block max)) times
    exp(block max - row max). The uniform picks a block by the blocks' cumulative mass, then a
    token inside it by the block's own cumulative sum: token j of block k is taken for
    ``u * total`` in [mass before k + mass of k's tokens before j, ... + p_j), probability
    p_j / total, as with one full-width cumulative sum. Compiled, the block masses are one
    read of the logits; nothing vocabulary-wide is written.
    """
    b, v = logits.shape
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    bs = block or block_size(v)
    full = v - v % bs
    blocks = scores[:, :full].view(b, -1, bs)
    bmax = blocks.amax(-1)
    bsum = (blocks - bmax[..., None]).exp().sum(-1)
    if full < v:
        tail = scores[:, full:]
        tmax = tail.amax(-1, keepdim=True)
        bmax = torch.cat([bmax, tmax], -1)
        bsum = torch.cat([bsum, (tail - tmax).exp().sum(-1, keepdim=True)], -1)
    scale = (bmax - bmax.amax(-1, keepdim=True)).exp()  # (B, nb), 1 for the top block
    mass = bsum * scale
    cum = mass.cumsum(-1)
    target = (u.float() * cum[:, -1]).unsqueeze(-1)
    k = _first_above(cum, target, mass > 0)  # (B, 1) block
    before = cum.gather(-1, k) - mass.gather(-1, k)
    rel = ((target - before) / scale.gather(-1, k)).clamp_(min=0.0)  # in the block's units
    cols = k * bs + torch.arange(bs, device=logits.device)  # (B, bs)
    x = scores.gather(-1, cols.clamp(max=v - 1))
    e = torch.where(cols < v, (x - bmax.gather(-1, k)).exp(), 0.0)
    j = _first_above(e.cumsum(-1), rel, e > 0)
    return (k * bs + j).squeeze(-1)


def plain_generate(
    model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same contract through HF ``generate`` (models the fast path does not cover)."""
    eos, pad = params.eos_token_id, params.pad_token_id
    kwargs: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "top_k": None,
    }
    if params.temperature > 0:
        kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None)
    was_training = model.training
    model.eval()
    try:
        with _seeded(params.generator, prompt_ids.device):
            out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask.long(), **kwargs)
    finally:
        model.train(was_training)
    ids = out[:, prompt_ids.shape[1] :]
    cmask = completion_mask_from_ids(ids, eos)
    return ids.masked_fill(~cmask, pad), cmask
