"""Sampling completions for GRPO rollouts.

Interface (stable; the trainer uses only this)::

    completion_ids, completion_mask = sample(
        model, prompt_ids, prompt_mask,
        max_new_tokens=128, temperature=1.0, top_p=1.0,
        eos_token_id=eos, pad_token_id=pad, generator=None,
    )

- ``prompt_ids`` (B, P) LongTensor, LEFT-padded; ``prompt_mask`` (B, P) 1/True for real tokens.
  For GRPO pass each prompt G times (B = prompts x G, rows of a group adjacent).
- Returns ``completion_ids`` (B, N) LongTensor with N <= max_new_tokens (the longest row; shorter
  rows are right-padded with ``pad_token_id``) and ``completion_mask`` (B, N) bool: True for the
  sampled tokens up to AND including the first EOS of the row; False after it. A row that never
  emits EOS is all True (truncated at max_new_tokens).
- ``temperature == 0`` is greedy. Otherwise the distribution is HF's: logits / temperature, then
  top-p (nucleus) filtering as ``transformers``' TopPLogitsWarper, then a multinomial draw. No
  top-k.
- ``generator``: a ``torch.Generator`` on the model's device for reproducible sampling.
- Log-probs are NOT returned: the trainer recomputes them with its training forward.

``Sampler(model)`` is the stateful form (caches buffers across calls); ``sample`` is a plain
function over a per-model cached ``Sampler``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["Sampler", "completion_mask_from_ids", "sample"]


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """True up to and including the first ``eos_token_id`` of each row (all True if none)."""
    is_eos = completion_ids == eos_token_id
    # number of EOS strictly before position t; the token at t is kept iff that count is 0
    before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()
    return before == 0


@contextlib.contextmanager
def _seeded(generator: torch.Generator | None, device: torch.device) -> Iterator[None]:
    """Run HF generate under the global RNG seeded from ``generator`` (plain path only)."""
    if generator is None:
        yield
        return
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


class Sampler:
    """Stateful sampler bound to one model."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @torch.no_grad()
    def __call__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        eos_token_id: int,
        pad_token_id: int,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model
        was_training = model.training
        model.eval()
        try:
            kwargs: dict[str, Any] = {
                "max_new_tokens": max_new_tokens,
                "eos_token_id": eos_token_id,
                "pad_token_id": pad_token_id,
                "top_k": None,
            }
            if temperature > 0:
                kwargs.update(do_sample=True, temperature=temperature, top_p=top_p)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None)
            with _seeded(generator, prompt_ids.device):
                out = model.generate(
                    input_ids=prompt_ids, attention_mask=prompt_mask.long(), **kwargs
                )
        finally:
            model.train(was_training)
        completion_ids = out[:, prompt_ids.shape[1] :]
        mask = completion_mask_from_ids(completion_ids, eos_token_id)
        completion_ids = completion_ids.masked_fill(~mask, pad_token_id)
        return completion_ids, mask


_SAMPLERS: dict[int, Sampler] = {}


def sample(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_token_id: int,
    pad_token_id: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample completions; see the module docstring for shapes and semantics."""
    sampler = _SAMPLERS.get(id(model))
    if sampler is None or sampler.model is not model:
        sampler = _SAMPLERS[id(model)] = Sampler(model)
    return sampler(
        prompt_ids,
        prompt_mask,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        generator=generator,
    )
