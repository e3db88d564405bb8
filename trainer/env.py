"""Multi-turn rollouts (Flow-GRPO): the policy acts, an environment answers, repeat.

An ``Environment`` is reset with a task and returns the first user message; each
``step(action_text)`` returns the observation text to append and whether the episode is
over. The policy's tokens (actions) are trained on; the observation tokens sit in the
context but get loss mask 0. The trajectory's reward (scored on the whole completion
text) is the advantage of every action token of every turn. A group is G trajectories of
the same task.

Token ids are never re-tokenised: each turn's sampled ids are kept as sampled (cut after
the environment's stop string), observations are tokenised on their own and appended, so
the training forward sees exactly the sequence the policy was sampled on.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from arbiter.calculator import MAX_LENGTH, calculate
from arbiter.trainer.data import Problem, render_prompt
from arbiter.trainer.generation import Sampler
from arbiter.trainer.rollout import Rollout, RolloutSpec, collate, generate, single_turn
from arbiter.trainer.sampling import SamplingParams

if TYPE_CHECKING:
    from arbiter.trainer.ors import OrsEnvironments

CALC_INSTRUCTION = (
    "Solve the math problem. Reason step by step inside <think>...</think>, then give only "
    "the final number inside <answer>...</answer>. While thinking you may use a calculator: "
    "write <calc>EXPRESSION</calc> (numbers, + - * / ** and parentheses) and the result "
    "comes back as <result>VALUE</result>."
)


@dataclass
class Step:
    observation: str
    done: bool
    tool_call: bool = False  # the action called a tool (the observation is its answer)
    tool_error: bool = False  # ... and the call failed (a bad expression)


class Environment(Protocol):
    """reset(task) -> first user message; step(action) -> observation, done."""

    stop_strings: tuple[str, ...]  # an action ends at the first of these (or at EOS)

    def reset(self, problem: Problem) -> str: ...

    def step(self, action: str, *, eos: bool) -> Step: ...


# A calculator call in an action: the in-process environment's and trainer.ors's (a longer
# one is no call: the calculator would refuse it)
CALC_CALL = re.compile(rf"<calc>([^<]{{0,{MAX_LENGTH}}})</calc>")


class CalculatorEnv:
    """GSM8K with a calculator tool: ``<calc>12*7</calc>`` -> ``<result>84</result>``, in
    ``arbiter.calculator``'s grammar (the environments service's ``calculate`` answers alike)."""

    stop_strings: tuple[str, ...] = ("</calc>",)
    _CALC = CALC_CALL

    def reset(self, problem: Problem) -> str:
        return f"{CALC_INSTRUCTION}\n\n{problem.question}"

    def step(self, action: str, *, eos: bool) -> Step:
        calls = self._CALC.findall(action)
        if eos or not calls:
            return Step(observation="", done=True)
        calc = calculate(calls[-1])
        error = calc.error is not None
        return Step(f"<result>{calc.text}</result>", False, tool_call=True, tool_error=error)


class CalculatorOffEnv(CalculatorEnv):
    """The calculator's prompt with no calculator behind it: one turn, nothing answers a
    ``<calc>`` (the single-turn baseline for tool use, on the same prompts); a call written
    is still counted (``tool_call``), unanswered."""

    stop_strings: tuple[str, ...] = ()

    def step(self, action: str, *, eos: bool) -> Step:
        return Step(observation="", done=True, tool_call=bool(self._CALC.search(action)))


ENVIRONMENTS: dict[str, type[CalculatorEnv]] = {
    "calculator": CalculatorEnv,
    "calculator-off": CalculatorOffEnv,
}


class BatchEnv(Protocol):
    """The environments of one rollout batch, stepped together: ``trainer.ors.OrsBatch``
    (episodes over HTTP, each turn's calls at once), or ``LocalBatch`` around in-process
    environments. ``rewards`` (None: score the texts through the gateway) are the episodes'
    own rewards, one per trajectory."""

    stop_strings: tuple[str, ...]

    def reset(self, problems: list[Problem]) -> list[str]: ...

    def step(self, actions: dict[int, tuple[str, bool]]) -> dict[int, Step]: ...


class LocalBatch:
    """One in-process environment per trajectory."""

    def __init__(self, env_factory: Callable[[], Environment], n: int):
        self.envs = [env_factory() for _ in range(n)]
        self.stop_strings = self.envs[0].stop_strings if self.envs else ()

    def reset(self, problems: list[Problem]) -> list[str]:
        return [env.reset(p) for env, p in zip(self.envs, problems, strict=True)]

    def step(self, actions: dict[int, tuple[str, bool]]) -> dict[int, Step]:
        return {i: self.envs[i].step(a, eos=eos) for i, (a, eos) in actions.items()}


def make_env(name: str) -> Environment:
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown env {name!r}: use none or one of {sorted(ENVIRONMENTS)}")
    return ENVIRONMENTS[name]()


def cut_at_stop(tokenizer: Any, ids: list[int], stops: tuple[str, ...]) -> tuple[list[int], bool]:
    """Shortest prefix of ``ids`` whose text contains a stop string (else all, False)."""
    if not stops:
        return ids, False
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if not any(s in text for s in stops):
        return ids, False
    lo, hi = 1, len(ids)  # smallest k with a stop in decode(ids[:k])
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tokenizer.decode(ids[:mid], skip_special_tokens=False) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return ids[:lo], True


def multi_turn(
    sampler: Sampler,
    tokenizer: Any,
    env_factory: Callable[[], Environment],
    problems: list[Problem],
    spec: RolloutSpec,
    params: SamplingParams,
    batch: BatchEnv | None = None,
) -> Rollout:
    """G trajectories per problem; each turn samples every trajectory at once, then steps
    every trajectory's environment at once (``batch``; default: ``env_factory``'s, in process).

    Finished trajectories are sampled along (their tokens are dropped), so every sampler call
    of a run has the same row count: a compiled, graph-captured sampler then compiles once
    per context length class instead of once per number of trajectories still going."""
    G = spec.group_size
    tasks = [p for p in problems for _ in range(G)]
    envs = batch if batch is not None else LocalBatch(env_factory, len(tasks))
    system = [{"role": "system", "content": spec.system_prompt}] if spec.system_prompt else []
    t_env = time.perf_counter()
    firsts = envs.reset(tasks)
    env_s = time.perf_counter() - t_env
    prompts = [  # the first user message is the environment's own (instruction + task)
        render_prompt(tokenizer, [*system, {"role": "user", "content": first}]) for first in firsts
    ]
    prompt_ids = [
        tokenizer(p, add_special_tokens=False)["input_ids"][-spec.max_prompt_tokens :]
        for p in prompts
    ]
    n = len(tasks)
    comp: list[list[int]] = [[] for _ in range(n)]
    act: list[list[int]] = [[] for _ in range(n)]
    turns, calls, errors = [0] * n, [0] * n, [0] * n
    active = list(range(n))
    eos, pad, device = params.eos_token_id, params.pad_token_id, sampler.device
    for _ in range(spec.max_turns):
        if not active:
            break
        ctx_ids, ctx_attn, _ = collate(
            [prompt_ids[i] + comp[i] for i in range(n)],
            [[] for _ in range(n)],
            [[] for _ in range(n)],
            pad,
            device,
        )
        # collate leaves one empty completion column
        ctx_ids, ctx_attn = ctx_ids[:, :-1], ctx_attn[:, :-1]
        out, out_mask = generate(sampler, ctx_ids, ctx_attn, params, spec.precision)
        out_ids, keep = out.tolist(), out_mask.tolist()
        still, actions = [], {}
        for i in active:
            ids = [t for t, k in zip(out_ids[i], keep[i], strict=True) if k]
            ended_eos = bool(ids) and ids[-1] == eos
            ids, stopped = cut_at_stop(tokenizer, ids, envs.stop_strings)
            ended_eos = ended_eos and not stopped
            comp[i] += ids
            act[i] += [1] * len(ids)
            turns[i] += 1
            text = tokenizer.decode(ids, skip_special_tokens=True)
            actions[i] = (text, ended_eos or not stopped)
        t_env = time.perf_counter()
        steps = envs.step(actions)
        env_s += time.perf_counter() - t_env
        for i in active:
            step = steps[i]
            calls[i] += step.tool_call
            errors[i] += step.tool_error
            if step.observation:
                obs = tokenizer(step.observation, add_special_tokens=False)["input_ids"]
                comp[i] += obs
                act[i] += [0] * len(obs)
            if not step.done:
                still.append(i)
        active = still
    input_ids, attention_mask, loss_mask = collate(prompt_ids, comp, act, pad, device)
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in comp]
    return Rollout(
        problems=problems,
        prompts=prompts[::G],
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        texts=texts,
        turns=turns,
        tool_calls=calls,
        tool_errors=errors,
        env_s=env_s,
    )


def rollout_batch(
    sampler: Sampler,
    tokenizer: Any,
    problems: list[Problem],
    spec: RolloutSpec,
    params: SamplingParams,
    ors: OrsEnvironments | None = None,
) -> Rollout:
    """Single-turn (``spec.env == "none"``) or multi-turn rollouts of ``problems``; with
    ``ors`` (``env=ors:<name>``), the episodes run through the environments service."""
    if spec.env == "none":
        return single_turn(sampler, tokenizer, problems, spec, params)
    if ors is None:
        return multi_turn(sampler, tokenizer, lambda: make_env(spec.env), problems, spec, params)
    batch = ors.batch()
    roll = multi_turn(sampler, tokenizer, CalculatorEnv, problems, spec, params, batch)
    roll.env_rewards = batch.rewards()  # the submits' rewards, a future
    return roll
