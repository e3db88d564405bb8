"""``env=ors:<name>``: the trainer's episodes through the gateway's ``/ors`` (a real keyed
gateway, envs service, verify and Redis: ``envs_stack``), every turn's calls at once, the
episodes' own rewards, and a service that cannot answer giving null rewards with a reason."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from arbiter.envs import Session
from arbiter.errors import ArbiterError
from arbiter.proto.components import ScoreGroup
from arbiter.trainer.data import Problem
from arbiter.trainer.env import CalculatorEnv
from arbiter.trainer.ors import OrsEnvironments, episode_rewards
from tests.arbiter.calculator_cases import CASES
from tests.services.gateway.envs_stack import EnvsStack, envs_stack

__all__ = ["envs_stack"]  # the fixture, imported for pytest


def problems(n: int) -> list[Problem]:
    return [
        Problem(id=f"p{i}", question=f"What is {i} * 7?", reference=str(i * 7)) for i in range(n)
    ]


@pytest.fixture
def ors(envs_stack: EnvsStack) -> Iterator[OrsEnvironments]:
    # the team's tool-call quota off for this gateway: 512 calls in one test
    with envs_stack.gateway_with(GATEWAY_ENVS_TOOL_CALLS_PER_MINUTE="0") as url:
        envs = OrsEnvironments("ors:calculator", url, envs_stack.keys.keys["alpha"])
        try:
            yield envs
        finally:
            envs.close()


def test_256_episodes_step_together_and_bring_their_own_rewards(ors: OrsEnvironments) -> None:
    tasks = problems(256)
    batch = ors.batch()
    prompts = batch.reset(tasks)
    # the trainer's own rendering, as in process: its tool syntax and the question
    assert prompts == [CalculatorEnv().reset(p) for p in tasks]
    # turn 1: every episode calls the calculator
    steps = batch.step({i: (f"<think><calc>{i} * 7</calc>", False) for i in range(256)})
    assert [s.observation for s in steps.values()][:3] == [
        "<result>0</result>",
        "<result>7</result>",
        "<result>14</result>",
    ]
    assert all(s.tool_call and not s.tool_error and not s.done for s in steps.values())
    # turn 2: even episodes answer right, odd ones wrong
    answers = {i: (f"</think><answer>{i * 7 + i % 2}</answer>", True) for i in range(256)}
    assert all(s.done for s in batch.step(answers).values())
    rewards = batch.rewards().result(timeout=120)
    # the gsm8k recipe: math_accuracy 1.0 when right + format 0.5 for the layout
    assert [r.reward for r in rewards] == [1.5 - i % 2 for i in range(256)]
    # in the trainer's shape: groups of 8, nothing masked
    groups = [
        ScoreGroup(id=f"g{g}", prompt="q", reference="r", responses=["x"] * 8) for g in range(32)
    ]
    shaped = episode_rewards(groups, rewards, "ors:calculator")
    assert shaped.flat() == [1.5 - i % 2 for i in range(256)]
    assert shaped.error_kinds() == {}


def test_an_episode_still_calling_after_the_last_turn_is_submitted_as_it_stands(
    ors: OrsEnvironments,
) -> None:
    batch = ors.batch()
    batch.reset(problems(2))
    batch.step({0: ("<calc>1 * 7</calc>", False), 1: ("<answer>7</answer>", True)})
    got = batch.rewards().result(timeout=60)
    # no <answer> in episode 0's text: scored 0 (as in process), not null, not dropped
    assert [r.reward for r in got] == [0.0, 1.0]
    assert [r.error for r in got] == ["", ""]


def test_the_episodes_are_deleted_once_their_rewards_are_in(ors: OrsEnvironments) -> None:
    batch = ors.batch()
    batch.reset(problems(3))
    batch.step({i: ("<answer>0</answer>", True) for i in range(3)})
    batch.rewards().result(timeout=60)
    sids = [sid for sid in map(batch.sid, range(3)) if sid is not None]
    sessions = [Session(ors.client, "calculator", sid) for sid in sids]
    assert len(sessions) == 3
    deadline = time.monotonic() + 30
    gone: set[str] = set()
    while len(gone) < 3 and time.monotonic() < deadline:  # the deletes are not waited for
        for s in sessions:
            try:
                s.prompt()
            except ArbiterError as e:
                assert e.status == 404
                gone.add(s.sid)
        time.sleep(0.1)
    assert len(gone) == 3


def test_a_bad_expression_is_the_policys_observation(ors: OrsEnvironments) -> None:
    batch = ors.batch()
    batch.reset(problems(1))
    step = batch.step({0: ("<calc>import os</calc>", False)})[0]
    assert step.tool_call and step.tool_error and not step.done
    assert step.observation.startswith("<result>error")
    batch.rewards().result(timeout=60)


def test_the_service_calculator_shows_what_the_in_process_one_shows(ors: OrsEnvironments) -> None:
    """Every row of the calculator's table, one episode each, through the gateway and the
    environments service: byte for byte the in-process observation (one grammar, one rendering)."""
    actions = {
        i: (f"<think><calc>{expression}</calc>", False)
        for i, (expression, _, _) in enumerate(CASES)
    }
    batch = ors.batch()
    batch.reset(problems(len(CASES)))
    steps = batch.step(actions)
    local = {i: CalculatorEnv().step(a, eos=eos) for i, (a, eos) in actions.items()}
    for i, (expression, shown, why) in enumerate(CASES):
        assert steps[i] == local[i], (expression, why)
        assert steps[i].observation == f"<result>{shown}</result>", (expression, why)
    batch.rewards().result(timeout=60)


def test_an_unreachable_service_gives_null_rewards_with_the_reason_never_0() -> None:
    from arbiter.procs import free_port
    from arbiter.retry import RetryPolicy

    envs = OrsEnvironments("ors:calculator", f"http://127.0.0.1:{free_port()}")
    envs.client.http.retry = RetryPolicy(attempts=1)
    try:
        batch = envs.batch()
        batch.reset(problems(4))
        batch.step({i: ("<answer>0</answer>", True) for i in range(4)})
        rewards = batch.rewards().result(timeout=60)
    finally:
        envs.close()
    assert [r.reward for r in rewards] == [None] * 4
    assert all(r.error.startswith("create: ") for r in rewards)
    groups = [ScoreGroup(id="g", prompt="q", reference="r", responses=["x"] * 4)]
    shaped = episode_rewards(groups, rewards, "ors:calculator")
    assert shaped.groups[0].masked == [True] * 4
    assert shaped.error_kinds() == {"environment": 4}
