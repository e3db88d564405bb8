"""The calculator environment end to end on the tiny model: a trajectory's tokens are exactly
the sampled ones, observation tokens get no gradient, the reward reaches every turn.

A random tiny model almost never writes ``</calc>``, and teaching it to takes minutes of
supervised training on two cores, so most tests drive ``multi_turn`` with a scripted policy
(the one stand-in here, for tool calls the random model cannot make): each row's turns are
fixed id sequences, spelled as tokenisations that re-tokenising their text would change
(``<calc>`` one character per token), with tokens after the stop string that must be cut.
The rollout then goes through the tiny model's real log-prob head and the real GRPO loss.
One test runs the real sampler on the random model through the same environment.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from arbiter.trainer.data import Problem, load_problems
from arbiter.trainer.env import CalculatorEnv, cut_at_stop, multi_turn
from arbiter.trainer.generation import Sampler
from arbiter.trainer.grpo import grpo_loss
from arbiter.trainer.logprobs import completion_logprobs
from arbiter.trainer.metrics import step_metrics
from arbiter.trainer.rollout import Rollout, RolloutSpec
from arbiter.trainer.sampling import SamplingParams

G = 4
PROBLEMS = [Problem(id="p0", question="What is 12 times 7 plus 5?", reference="89")]


def chars(tok: Any, text: str) -> list[int]:
    """``text`` one byte-level token per character (not how the tokenizer would split it)."""
    return [tok.convert_tokens_to_ids(c) for c in text]


def canon(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def scripts(tok: Any) -> list[list[list[int]]]:
    """Per row, per turn: the ids the policy 'samples' (EOS ends a row's last turn)."""
    eos = tok.eos_token_id
    think, end = canon(tok, "<think>"), canon(tok, "</think><answer>89</answer>")
    return [
        # two calls, then the answer; junk after each </calc> is sampled but cut
        [think + chars(tok, "<calc>12*7</calc>") + canon(tok, " 99"),
         chars(tok, "<calc>84+5</calc>") + canon(tok, "1"), [*end, eos]],
        # no call: one turn
        [think + canon(tok, "12 * 7 + 5 = 89.") + [*end, eos]],
        # a bad expression: an error result, then the answer
        [think + chars(tok, "<calc>12*</calc>"), [*end, eos]],
        # calls until max_turns cuts the trajectory (it ends on an observation)
        [chars(tok, "<calc>1+1</calc>")] * 3,
    ]  # fmt: skip


class ScriptedPolicy:
    """Answers each sampler call with the next turn of every row's script, padded like the
    real sampler (right-padded ids, a keep-mask up to and including EOS); records the
    contexts it was given, to check what the environment fed back."""

    def __init__(self, tok: Any, rows: list[list[list[int]]]) -> None:
        self.tok, self.rows, self.device = tok, rows, torch.device("cpu")
        self.turn = 0
        self.contexts: list[list[list[int]]] = []

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams) -> Any:
        self.contexts.append([r[m.bool()].tolist() for r, m in zip(ids, mask, strict=True)])
        outs = [s[min(self.turn, len(s) - 1)] for s in self.rows]
        self.turn += 1
        width = max(len(o) for o in outs)
        out = torch.full((len(outs), width), params.pad_token_id, dtype=torch.long)
        keep = torch.zeros((len(outs), width), dtype=torch.bool)
        for i, o in enumerate(outs):
            out[i, : len(o)], keep[i, : len(o)] = torch.tensor(o), True
        return out, keep


@pytest.fixture(scope="module")
def scripted(tiny: tuple[Any, Any]) -> tuple[Rollout, ScriptedPolicy, list[list[list[int]]]]:
    _, tok = tiny
    rows = scripts(tok)
    policy = ScriptedPolicy(tok, rows)
    spec = RolloutSpec(group_size=G, max_prompt_tokens=256, env="calculator", max_turns=3)
    params = SamplingParams.for_tokenizer(tok, 32)
    roll = multi_turn(policy, tok, CalculatorEnv, PROBLEMS, spec, params)  # type: ignore[arg-type]
    return roll, policy, rows


def test_a_trajectory_is_exactly_the_sampled_tokens_and_the_observations(
    tiny: tuple[Any, Any], scripted: tuple[Rollout, ScriptedPolicy, list[list[list[int]]]]
) -> None:
    _, tok = tiny
    roll, _, rows = scripted
    eos = tok.eos_token_id
    stop = chars(tok, "<calc>12*7</calc>")
    assert canon(tok, tok.decode(stop)) != stop  # re-tokenising would change these ids
    r84, r89 = canon(tok, "<result>84</result>"), canon(tok, "<result>89</result>")
    err, r2 = canon(tok, "<result>error: does not parse</result>"), canon(tok, "<result>2</result>")
    s = rows
    want = [
        # (ids, loss mask): the sampled turns cut after </calc>, each result tokenised alone
        (s[0][0][:-len(canon(tok, " 99"))] + r84 + s[0][1][:-1] + r89 + s[0][2]),
        s[1][0],
        s[2][0] + err + s[2][1],
        (s[3][0] + r2) * 3,
    ]  # fmt: skip
    masks = [
        [1] * (len(s[0][0]) - len(canon(tok, " 99"))) + [0] * len(r84)
        + [1] * (len(s[0][1]) - 1) + [0] * len(r89) + [1] * len(s[0][2]),
        [1] * len(s[1][0]),
        [1] * len(s[2][0]) + [0] * len(err) + [1] * len(s[2][1]),
        ([1] * len(s[3][0]) + [0] * len(r2)) * 3,
    ]  # fmt: skip
    P = roll.input_ids.shape[1] - roll.n_completion
    for i, (ids, mask) in enumerate(zip(want, masks, strict=True)):
        n = len(ids)
        assert roll.input_ids[i, P : P + n].tolist() == ids
        assert roll.loss_mask[i, :n].tolist() == mask  # observations: in context, no loss
        assert roll.attention_mask[i, P : P + n].all() and not roll.attention_mask[i, P + n :].any()
    assert roll.turns == [3, 1, 2, 3]
    assert roll.tool_calls == [2, 0, 1, 3] and roll.tool_errors == [0, 0, 1, 0]
    assert roll.texts[0].endswith("<result>89</result></think><answer>89</answer>")
    assert eos not in roll.input_ids[3, P:].tolist()  # cut by max_turns, on an observation


def test_the_environment_feeds_back_the_trajectory_so_far(
    scripted: tuple[Rollout, ScriptedPolicy, list[list[list[int]]]],
) -> None:
    roll, policy, _ = scripted
    assert len(policy.contexts) == max(roll.turns)
    for i in range(len(roll)):
        whole = roll.input_ids[i][roll.attention_mask[i].bool()].tolist()
        seen = [policy.contexts[t][i] for t in range(roll.turns[i])]
        # each turn's context is the prompt + every earlier turn and observation, as kept
        assert all(whole[: len(c)] == c for c in seen)
        assert all(len(a) < len(b) for a, b in itertools.pairwise(seen))
    # finished rows are sampled along (their tokens dropped): every call has every row
    assert {len(c) for c in policy.contexts} == {len(roll)}


def test_observation_tokens_get_no_gradient(
    tiny: tuple[Any, Any], scripted: tuple[Rollout, ScriptedPolicy, list[list[list[int]]]]
) -> None:
    model, _ = tiny
    roll, _, _ = scripted
    n = roll.n_completion
    P = roll.input_ids.shape[1] - n
    hidden: list[torch.Tensor] = []

    def keep(_: Any, __: Any, out: torch.Tensor) -> None:
        out.retain_grad()
        hidden.append(out)

    handle = model.model.norm.register_forward_hook(keep)
    model.zero_grad()
    try:
        logps, _ = completion_logprobs(model, roll.input_ids, roll.attention_mask, n)
        adv = torch.tensor([1.0, -0.5, 0.25, -0.75])  # a different advantage for every row
        grpo_loss(logps, logps.detach(), adv, roll.loss_mask, beta=0.0).loss.backward()
    finally:
        handle.remove()
        model.zero_grad()
    # the final hidden state at position t feeds only the prediction of token t + 1
    assert hidden[0].grad is not None
    grad = hidden[0].grad[:, P - 1 : P - 1 + n].abs().sum(-1)  # (S, N)
    obs = (roll.loss_mask == 0) & (roll.attention_mask[:, P:] == 1)
    assert int(obs.sum()) > 20
    assert grad[obs].max() == 0.0
    assert (grad[roll.loss_mask == 1] > 0).all()


def test_the_reward_reaches_every_turn(
    scripted: tuple[Rollout, ScriptedPolicy, list[list[list[int]]]],
) -> None:
    roll, _, _ = scripted
    logps = torch.randn(roll.loss_mask.shape, requires_grad=True)
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75])
    tokens = float(roll.loss_mask.sum())
    grpo_loss(logps, logps.detach(), adv, roll.loss_mask, beta=0.0, norm=tokens).loss.backward()
    assert logps.grad is not None
    for i in range(len(roll)):
        acts = roll.loss_mask[i] == 1
        # every action token of every turn: d loss / d logp = -A_i / tokens (ratio 1)
        want = torch.full((int(acts.sum()),), -float(adv[i]) / tokens)
        torch.testing.assert_close(logps.grad[i, acts], want)
        assert (logps.grad[i, ~acts] == 0).all()


def test_tool_use_is_logged(
    scripted: tuple[Rollout, ScriptedPolicy, list[list[list[int]]]],
) -> None:
    from arbiter.trainer.rewards import BatchRewards, GroupRewards

    roll, _, _ = scripted
    rewards = [1.5, 0.5, 1.5, 0.0]
    result = BatchRewards([GroupRewards("p0", list(rewards), {}, [False] * 4)], "r", "f", 0.1)
    m = step_metrics(result, torch.tensor(rewards), G, roll, {})
    assert m["tools/calls_per_episode"] == 6 / 4 and m["tools/episode_frac"] == 3 / 4
    assert m["tools/errors"] == 1 and m["turns/mean"] == 9 / 4


def test_the_real_sampler_through_the_calculator(tiny: tuple[Any, Any], gsm8k_dir: Path) -> None:
    """The random model's own samples: whatever it writes, the trajectory is its ids."""
    model, tok = tiny
    problems = load_problems(gsm8k_dir / "test.jsonl", 2)
    calls: list[list[list[int]]] = []
    sampler = Sampler(model)

    def recording(ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams) -> Any:
        out, keep = sampler(ids, mask, params)
        calls.append([o[k].tolist() for o, k in zip(out, keep.bool(), strict=True)])
        return out, keep

    recording.device = sampler.device  # type: ignore[attr-defined]
    spec = RolloutSpec(group_size=G, max_prompt_tokens=256, env="calculator", max_turns=2)
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams.for_tokenizer(tok, 24, temperature=1.0, generator=gen)
    roll = multi_turn(recording, tok, CalculatorEnv, problems, spec, params)  # type: ignore[arg-type]
    P = roll.input_ids.shape[1] - roll.n_completion
    for i in range(len(roll)):
        ids, _ = cut_at_stop(tok, calls[0][i], ("</calc>",))
        assert roll.input_ids[i, P : P + len(ids)].tolist() == ids
        assert roll.loss_mask[i, : len(ids)].all()
