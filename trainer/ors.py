"""Episodes through Arbiter's environments service (``env=ors:<name>``), batched.

The policy writes the same text as with the in-process calculator (``trainer.env``): a
``<calc>EXPR</calc>`` ends a turn and becomes the episode's ``calculate(expression=EXPR)``
call, whose answer comes back as ``<result>VALUE</result>``; a turn that ends any other way
submits the episode's whole text so far (``submit(answer=...)``), and that call's reward is the
trajectory's reward (the environment's recipe, the same components as ``/v1/score``). The
first user message is the episode's own prompt (``GET /{env}/prompt``).

Every turn's calls of a batch go out at once, on a thread pool over one ``arbiter.envs``
client (its retries and ``Idempotency-Key`` per call), so 256 episodes cost one round trip
a turn, not 256. A call the service could not answer (unavailable, timed out after retries)
makes that episode's reward null with its reason: masked, never 0. Episodes are deleted when
the batch ends.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from arbiter.envs import EnvsClient, Session, ToolRefused
from arbiter.errors import ArbiterError
from arbiter.proto.gateway import ScoreGroup
from arbiter.trainer.data import Problem
from arbiter.trainer.env import CALC_CALL, CalculatorEnv, Step
from arbiter.trainer.rewards import BatchRewards, GroupRewards

PREFIX = "ors:"
T = TypeVar("T")


@dataclass
class EnvReward:
    reward: float | None
    error: str = ""  # why the reward is null


class OrsBatch:
    """The episodes of one rollout batch on environment ``name`` (one per trajectory)."""

    stop_strings = CalculatorEnv.stop_strings

    def __init__(self, client: EnvsClient, name: str, pool: ThreadPoolExecutor):
        self.client, self.name, self.pool = client, name, pool
        self.sessions: list[Session | None] = []
        self.texts: list[str] = []
        self.rewards: list[EnvReward] = []

    def _each(self, fn: Callable[[int], T], items: list[int]) -> list[T | ArbiterError]:
        def guarded(i: int) -> T | ArbiterError:
            try:
                return fn(i)
            except ArbiterError as e:
                return e

        return list(self.pool.map(guarded, items))

    def reset(self, problems: list[Problem]) -> list[str]:
        """One episode per problem (GSM8K's question and worked answer as its task); the
        first user messages."""

        def open_one(i: int) -> tuple[Session, str]:
            p = problems[i]
            task = {"question": p.question, "answer": p.reference}
            s = self.client.session(self.name, task)
            return s, "\n".join(b.text for b in s.prompt())

        opened = self._each(open_one, list(range(len(problems))))
        self.texts = [""] * len(problems)
        self.rewards = [EnvReward(None, "episode not finished")] * len(problems)
        self.sessions, prompts = [], []
        for i, got in enumerate(opened):
            if isinstance(got, ArbiterError):
                self.sessions.append(None)
                self.rewards[i] = EnvReward(None, f"create: {got}")
                prompts.append(problems[i].question)  # sampled along, masked
            else:
                self.sessions.append(got[0])
                prompts.append(got[1])
        return prompts

    def step(self, actions: dict[int, tuple[str, bool]]) -> dict[int, Step]:
        """Each trajectory's turn (its action text, whether it ended at EOS) -> its Step."""

        def one(i: int) -> Step:
            action, eos = actions[i]
            self.texts[i] += action
            s = self.sessions[i]
            if s is None:
                return Step("", True)
            calls = CALC_CALL.findall(action)
            if not eos and calls:
                try:
                    out = s.call("calculate", expression=calls[-1])
                    value = "".join(b.text for b in out.blocks).strip()
                    failed = bool(out.metadata and "error" in out.metadata)
                except ToolRefused as e:  # the policy's bad expression: its observation
                    value, failed = f"error: {e}"[:200], True
                obs = f"<result>{value}</result>"
                self.texts[i] += obs
                return Step(obs, False, tool_call=True, tool_error=failed)
            try:
                out = s.call("submit", answer=self.texts[i])
                self.rewards[i] = EnvReward(out.reward, "" if out.reward is not None else
                                            "submit returned no reward")  # fmt: skip
            except ToolRefused as e:
                self.rewards[i] = EnvReward(None, f"submit refused: {e}")
            return Step("", True)

        done = self._each(one, list(actions))
        out: dict[int, Step] = {}
        for i, got in zip(actions, done, strict=True):
            if isinstance(got, ArbiterError):  # the service's failure, not the policy's
                self.rewards[i] = EnvReward(None, f"{got.kind}: {got}")
                out[i] = Step("", True)
            else:
                out[i] = got
        return out

    def close(self) -> None:
        def end(i: int) -> None:
            s = self.sessions[i]
            if s is not None:
                s.close()

        self._each(end, list(range(len(self.sessions))))


class OrsEnvironments:
    """``env=ors:<name>``: a client and a thread pool for the run; ``batch()`` per rollout."""

    def __init__(self, spec: str, base_url: str, api_key: str = "", concurrency: int = 64):
        self.name = spec.removeprefix(PREFIX)
        self.client = EnvsClient(base_url, api_key=api_key or None)
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="ors")

    def batch(self) -> OrsBatch:
        return OrsBatch(self.client, self.name, self.pool)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def episode_rewards(groups: list[ScoreGroup], rewards: list[EnvReward], env: str) -> BatchRewards:
    """The episodes' rewards in the gateway's shape: a null one masked, with its reason
    (kind ``environment``), so the step's metrics and advantages treat both alike."""
    out, k = [], 0
    for g in groups:
        got = rewards[k : k + len(g.responses)]
        k += len(g.responses)
        errors = [
            {"component": env, "index": j, "kind": "environment", "message": r.error}
            for j, r in enumerate(got)
            if r.reward is None
        ]
        values = [r.reward for r in got]
        out.append(GroupRewards(g.id, values, {env: values}, [v is None for v in values], errors))
    return BatchRewards(out, recipe_name=env, fingerprint="", elapsed_s=0.0)
