"""One GRPO update on the tiny model: every trainable parameter moves; observation tokens of
a multi-turn trajectory get no gradient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arbiter.trainer.config import TrainerConfig
from arbiter.trainer.data import Problem
from arbiter.trainer.env import Step, multi_turn
from arbiter.trainer.generation import Sampler
from arbiter.trainer.grpo import build_optimizer, grpo_loss
from arbiter.trainer.logprobs import completion_logits, token_logprobs
from arbiter.trainer.rollout import RolloutSpec, sequence_logprobs, single_turn
from arbiter.trainer.sampling import SamplingParams
from arbiter.trainer.setup import Dist, load_model, load_tokenizer
from arbiter.trainer.update import train_on_batch

PROBLEMS = [
    Problem(id=f"p{i}", question=f"What is {i} + {i}?", reference=str(2 * i)) for i in range(2)
]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


SPEC = RolloutSpec(group_size=4, max_prompt_tokens=128)


def _params(tok: object, max_new_tokens: int = 8) -> SamplingParams:
    gen = torch.Generator().manual_seed(0)
    return SamplingParams.for_tokenizer(tok, max_new_tokens, generator=gen)


@pytest.mark.parametrize(
    "overrides",
    [
        # plain GRPO, ratio exactly 1 (old log-probs are the detached current ones)
        {},
        # KL to a reference, seq-mean, two inner passes with micro-batches
        {"beta": 0.1, "loss_agg": "seq_mean", "mu": 2, "micro_batch_size": 4},
        # activations recomputed in backward, log-probs 3 tokens at a time
        {"gradient_checkpointing": True, "micro_batch_size": 4, "logprob_chunk_tokens": 3},
        # the whole logits tensor at once (the plain way)
        {"logprob_chunk_tokens": 0},
    ],
)
def test_one_step_changes_every_parameter(tiny_model: Path, overrides: dict[str, object]) -> None:
    settings: dict[str, object] = {
        "rollouts_per_step": 8,
        "group_size": 4,
        "lr": 1e-2,
        "micro_batch_size": 8,
    }
    cfg = TrainerConfig(model=str(tiny_model), **{**settings, **overrides})  # type: ignore[arg-type]
    tok = load_tokenizer(tiny_model)
    policy = load_model(
        tiny_model,
        torch.device("cpu"),
        "fp32",
        trainable=True,
        gradient_checkpointing=cfg.gradient_checkpointing,
    )
    roll = single_turn(Sampler(policy), tok, PROBLEMS, SPEC, _params(tok))
    if cfg.beta > 0:
        ref = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=False)
        roll.ref_logps = sequence_logprobs(ref, roll, 4, "fp32", cfg.logprob_chunk_tokens)
        roll.old_logps = sequence_logprobs(policy, roll, 4, "fp32", cfg.logprob_chunk_tokens)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    opt, _ = build_optimizer(policy, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, -1.0, 1.0, 0.0, 0.0])
    stats = train_on_batch(cfg, policy, opt, roll, adv, Dist(), "fp32")
    assert stats["entropy"] > 0
    assert stats["grad_norm"] > 0
    unchanged = [
        n for n, p in policy.named_parameters() if p.requires_grad and torch.equal(p, before[n])
    ]
    assert unchanged == []


class CountingEnv:
    """A real Environment (not a stub of one): each action ends at the first space; it answers
    with a fixed observation, twice, then ends the episode."""

    stop_strings: tuple[str, ...] = (" ",)
    OBS = "<result>42</result>"

    def __init__(self) -> None:
        self.turns = 0

    def reset(self, problem: Problem) -> str:
        return problem.question

    def step(self, action: str, *, eos: bool) -> Step:
        self.turns += 1
        if eos or self.turns >= 3:
            return Step("", True)
        return Step(self.OBS, False)


def test_observation_tokens_get_no_gradient(tiny_model: Path) -> None:
    tok = load_tokenizer(tiny_model)
    policy = load_model(tiny_model, torch.device("cpu"), "fp32", trainable=True)
    spec = RolloutSpec(group_size=4, max_prompt_tokens=128, env="counting", max_turns=3)
    roll = multi_turn(Sampler(policy), tok, CountingEnv, PROBLEMS, spec, _params(tok, 12))
    obs_ids = tok(CountingEnv.OBS, add_special_tokens=False)["input_ids"]
    N = roll.n_completion
    comp = roll.input_ids[:, -N:]
    # the observation is in the context (attended) but not in the loss
    with_obs = [i for i in range(len(roll)) if "<result>42</result>" in roll.texts[i]]
    assert with_obs, "no trajectory reached a second turn"
    n_obs = 0
    for i in with_obs:
        row = comp[i].tolist()
        for s in range(N - len(obs_ids) + 1):
            if row[s : s + len(obs_ids)] == obs_ids and roll.attention_mask[i, -N + s] == 1:
                assert roll.loss_mask[i, s : s + len(obs_ids)].sum() == 0
                assert roll.attention_mask[i, -N + s : -N + s + len(obs_ids)].all()
                n_obs += 1
    assert n_obs >= len(with_obs)
    # gradient w.r.t. the logits that predict observation tokens is exactly zero
    logits = completion_logits(policy, roll.input_ids, roll.attention_mask, N)
    logits.retain_grad()
    logps = token_logprobs(logits, comp)
    adv = torch.linspace(-1, 1, len(roll))
    grpo_loss(
        logps, logps.detach(), adv, roll.loss_mask, ref_logps=logps.detach() - 0.1, beta=0.1
    ).loss.backward()
    assert logits.grad is not None
    per_pos = logits.grad.abs().sum(-1)  # (S, N)
    obs_pos = (roll.loss_mask == 0) & (roll.attention_mask[:, -N:] == 1)
    assert obs_pos.any()
    assert per_pos[obs_pos].sum().item() == 0.0
    assert per_pos[roll.loss_mask.bool()].sum().item() > 0
    # every action turn was trained on: turns > 1 where the observation appears
    assert all(roll.turns[i] >= 2 for i in with_obs)
