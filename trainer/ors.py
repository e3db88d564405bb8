"""Episodes through Arbiter's environments service (``env=ors:<name>``), batched.

The policy writes the same text as with the in-process calculator (``trainer.env``): a
``<calc>EXPR</calc>`` ends a turn and becomes the episode's ``calculate(expression=EXPR)``
call, whose answer comes back as ``<result>VALUE</result>``; a turn that ends any other way
submits the episode's whole text so far (``submit(answer=...)``), and that call's reward is the
trajectory's reward (the environment's recipe, the same components as ``/v1/score``). An
episode still calling the tool after the last turn is submitted as it stands, as the
in-process run scores its text.

The first user message is the trainer's own rendering of the task, in its tool syntax (the
in-process calculator's instruction and the question), as a framework renders an
environment's tools into its chat template: the service's prompt names the ORS tools, which
this parser maps to ``<calc>``; the policy sees the same prompt either way.

Every turn's calls of a batch go out at once, on a thread pool over one ``arbiter.envs``
client (its retries and ``Idempotency-Key`` per call), so 256 episodes cost one round trip
a turn, not 256. The submits and the deletes leave the rollout's critical path: a submit
is sent when its episode ends and the rewards are a future the trainer waits for with the
other rewards (the next batch samples meanwhile); the deletes follow the rewards. A call the
service could not answer (unavailable, timed out after retries) makes that episode's reward
null with its reason: masked, never 0.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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
        self.opening: list[Future[Session | ArbiterError]] = []
        self.texts: list[str] = []
        # episodes whose reward is null already: never opened, or a call the service failed
        self.null: dict[int, EnvReward] = {}
        self.submits: dict[int, Future[EnvReward]] = {}

    @staticmethod
    def _guarded(fn: Callable[[int], T], i: int) -> T | ArbiterError:
        try:
            return fn(i)
        except ArbiterError as e:
            return e

    def reset(self, problems: list[Problem]) -> list[str]:
        """One episode per problem (GSM8K's question and worked answer as its task), opened
        while the first turn samples; the first user messages, rendered as in process."""

        def open_one(i: int) -> Session:
            p = problems[i]
            return self.client.session(self.name, {"question": p.question, "answer": p.reference})

        # a task queued on the pool after these may wait for them: they started before it
        self.opening = [self.pool.submit(self._guarded, open_one, i) for i in range(len(problems))]
        self.texts = [""] * len(problems)
        env = CalculatorEnv()
        return [env.reset(p) for p in problems]

    def session(self, i: int) -> Session | None:
        """Episode ``i``'s session once opened; None when it could not be (its reward null)."""
        got = self.opening[i].result()
        if isinstance(got, ArbiterError):
            self.null.setdefault(i, EnvReward(None, f"create: {got}"))
            return None
        return got

    def _submit(self, i: int) -> EnvReward:
        s = self.session(i)
        if s is None or i in self.null:
            return self.null[i]
        try:
            out = s.call("submit", answer=self.texts[i])
        except ToolRefused as e:
            return EnvReward(None, f"submit refused: {e}")
        except ArbiterError as e:  # the service's failure, not the policy's
            return EnvReward(None, f"{e.kind}: {e}")
        return EnvReward(out.reward, "" if out.reward is not None else "submit returned no reward")

    def _end(self, i: int) -> None:
        """The episode's submit, sent now; its reward is collected by ``rewards``."""
        if i not in self.submits:
            self.submits[i] = self.pool.submit(self._submit, i)

    def _calculate(self, i: int, expression: str) -> Step:
        s = self.session(i)
        if s is None:
            return Step("", True)
        try:
            out = s.call("calculate", expression=expression)
            value = "".join(b.text for b in out.blocks).strip()
            failed = bool(out.metadata and "error" in out.metadata)
        except ToolRefused as e:  # the policy's bad expression: its observation
            value, failed = f"error: {e}"[:200], True
        except ArbiterError as e:  # the service's failure, not the policy's
            self.null[i] = EnvReward(None, f"{e.kind}: {e}")
            return Step("", True)
        obs = f"<result>{value}</result>"
        self.texts[i] += obs
        return Step(obs, False, tool_call=True, tool_error=failed)

    def step(self, actions: dict[int, tuple[str, bool]]) -> dict[int, Step]:
        """Each trajectory's turn (its action text, whether it ended at EOS) -> its Step:
        the turn's calculator calls at once; the others end their episodes (submits sent)."""
        calling: dict[int, Future[Step]] = {}
        out: dict[int, Step] = {}
        for i, (action, eos) in actions.items():
            self.texts[i] += action
            calls = CALC_CALL.findall(action)
            if eos or not calls or i in self.null:
                out[i] = Step("", True)
            else:
                calling[i] = self.pool.submit(self._calculate, i, calls[-1])
        for i, f in calling.items():
            out[i] = f.result()
        for i, step in out.items():
            if step.done:
                self._end(i)
        return out

    def rewards(self) -> Future[list[EnvReward]]:
        """Every episode's reward once its submit has answered (an episode still going after
        the last turn is submitted now); then the episodes are deleted, not waited for."""
        for i in range(len(self.opening)):
            self._end(i)
        futures = [self.submits[i] for i in range(len(self.opening))]

        def collect() -> list[EnvReward]:
            got = [f.result() for f in futures]
            for i in range(len(self.opening)):
                self.pool.submit(self._guarded, self._delete, i)
            return got

        return _COLLECTOR.submit(collect)

    def _delete(self, i: int) -> None:
        s = self.opening[i].result()
        if not isinstance(s, ArbiterError):
            s.close()


# Waits for a batch's submits (never on the pool it waits for, which could be full of them)
_COLLECTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ors-rewards")


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


def episode_rewards_later(
    groups: list[ScoreGroup], rewards: Future[list[EnvReward]], env: str
) -> Future[BatchRewards]:
    """``episode_rewards`` once the episodes' rewards are in (a future, as the gateway's)."""
    out: Future[BatchRewards] = Future()

    def done(got: Future[list[EnvReward]]) -> None:
        try:
            out.set_result(episode_rewards(groups, got.result(), env))
        except BaseException as e:  # handed to whoever waits on ``out``
            out.set_exception(e)

    rewards.add_done_callback(done)
    return out


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
