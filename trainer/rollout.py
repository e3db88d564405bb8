"""Rollouts: prompts -> sampled completions laid out for the training forward.

Layout of a batch of S = groups x G sequences (rows of a group adjacent)::

    input_ids      (S, P + N)   [left-padded prompt | completion, right-padded]
    attention_mask (S, P + N)   1 on real tokens (prompt, actions, observations)
    loss_mask      (S, N)       1 on the policy's own tokens (actions) only

What to sample is a ``SamplingParams``; how prompts become a batch is a ``RolloutSpec``.
Every call into the sampler goes through ``generate`` below (one place to adapt).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from arbiter.trainer.data import Problem, chat_messages, render_prompt
from arbiter.trainer.generation import Sampler
from arbiter.trainer.logprobs import completion_logprobs, micro_batches
from arbiter.trainer.sampling import SamplingParams


@dataclass(frozen=True)
class RolloutSpec:
    """How problems become sampled sequences (the rest is ``SamplingParams``)."""

    group_size: int  # G completions per problem, rows of a group adjacent
    max_prompt_tokens: int  # longer prompts are left-truncated
    system_prompt: str = ""
    env: str = "none"  # "none": single turn; else a multi-turn environment (trainer.env)
    max_turns: int = 1  # multi-turn only
    precision: str = "fp32"  # bf16-mixed: sample under bf16 autocast


@dataclass
class Rollout:
    problems: list[Problem]  # one per group
    prompts: list[str]  # rendered prompt text, one per group
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    texts: list[str]  # completion text per sequence (what the reward service reads)
    turns: list[int] = field(default_factory=list)
    tool_calls: list[int] = field(default_factory=list)  # per sequence (multi-turn only)
    tool_errors: list[int] = field(default_factory=list)  # tool calls that failed
    # env=ors:<name>: the episodes' own rewards (a future of trainer.ors.EnvReward's), not
    # the gateway's
    env_rewards: Future[list[Any]] | None = None
    env_s: float = 0.0  # seconds the rollout spent in its environments' reset and steps
    old_logps: torch.Tensor | None = None  # behaviour policy, (S, N)
    ref_logps: torch.Tensor | None = None  # frozen reference, (S, N)

    @property
    def n_completion(self) -> int:
        return int(self.loss_mask.shape[1])

    @property
    def action_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "bf16-mixed" and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def generate(
    sampler: Sampler,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    params: SamplingParams,
    precision: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The single call site of the sampler: (S, P) left-padded -> (S, N) ids, (S, N) bool mask."""
    with autocast(prompt_ids.device, precision):
        return sampler(prompt_ids, prompt_mask, params)


def encode_prompts(
    tokenizer: Any, prompts: list[str], device: torch.device, max_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded, left-truncated prompt ids and mask (S, P)."""
    tokenizer.padding_side = "left"
    tokenizer.truncation_side = "left"
    enc = tokenizer(
        prompts,
        return_tensors="pt",
        padding=True,
        truncation=True,
        max_length=max_tokens,
        add_special_tokens=False,
    )
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def single_turn(
    sampler: Sampler,
    tokenizer: Any,
    problems: list[Problem],
    spec: RolloutSpec,
    params: SamplingParams,
) -> Rollout:
    """B problems -> B x G completions in one sampler call."""
    prompts = [
        render_prompt(tokenizer, chat_messages(p.question, spec.system_prompt)) for p in problems
    ]
    repeated = [p for p in prompts for _ in range(spec.group_size)]
    prompt_ids, prompt_mask = encode_prompts(
        tokenizer, repeated, sampler.device, spec.max_prompt_tokens
    )
    comp_ids, comp_mask = generate(sampler, prompt_ids, prompt_mask, params, spec.precision)
    comp_mask = comp_mask.to(prompt_mask.dtype)
    texts = tokenizer.batch_decode(
        comp_ids.masked_fill(comp_mask == 0, params.pad_token_id), skip_special_tokens=True
    )
    return Rollout(
        problems=problems,
        prompts=prompts,
        input_ids=torch.cat([prompt_ids, comp_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, comp_mask], dim=1),
        loss_mask=comp_mask,
        texts=texts,
        turns=[1] * len(texts),
    )


def collate(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    action_masks: list[list[int]],
    pad_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token lists -> (input_ids, attention_mask, loss_mask) in the layout above."""
    S = len(prompt_ids)
    P = max(len(p) for p in prompt_ids)
    N = max(1, max(len(c) for c in completion_ids))
    ids = torch.full((S, P + N), pad_id, dtype=torch.long)
    attn = torch.zeros((S, P + N), dtype=torch.long)
    loss = torch.zeros((S, N), dtype=torch.long)
    for i, (p, c, m) in enumerate(zip(prompt_ids, completion_ids, action_masks, strict=True)):
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) : P] = 1
        if c:
            ids[i, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            attn[i, P : P + len(c)] = 1
            loss[i, : len(c)] = torch.tensor(m, dtype=torch.long)
    return ids.to(device), attn.to(device), loss.to(device)


@torch.no_grad()
def sequence_logprobs(
    model: Any,
    rollout: Rollout,
    micro_batch_size: int,
    precision: str,
    chunk_tokens: int = 1024,
    *,
    shared_prefix: bool = False,
) -> torch.Tensor:
    """Per-token log-probs of the completion tokens under ``model``: (S, N), fp32 (the
    training forward's path: ``shared_prefix`` as in ``completion_logprobs``)."""
    was_training = model.training
    model.eval()
    N = rollout.n_completion
    out = []
    try:
        parts = micro_batches(
            model, rollout.input_ids, rollout.attention_mask, rollout.loss_mask,
            micro_batch_size, shared_prefix=shared_prefix, chunk_tokens=chunk_tokens,
        )  # fmt: skip
        for _, ids, attn, n, plan in parts:
            with autocast(ids.device, precision):
                logps, _ = completion_logprobs(
                    model, ids, attn, n, chunk_tokens=chunk_tokens, shared_prefix=plan or False
                )
            out.append(torch.nn.functional.pad(logps, (0, N - n)))  # 0 past the last action
    finally:
        model.train(was_training)
    return torch.cat(out, dim=0)
