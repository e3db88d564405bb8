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

Every turn's calls of a batch go out at once through Arbiter's batch routes beside ORS's
one-call routes (``/v1/envs/batch/*``; ``arbiter.envs``'s ``open_many``, ``call_many``,
``delete_many``, with its retries and an ``Idempotency-Key`` per request): ``CHUNK`` episodes
a request, a turn's requests in flight at once on a few threads, so 512 episodes cost about
eight requests a turn, not 512. Fewer requests is the point: the trainer's process runs the
HTTP client beside the sampler, and every request's Python (the client, JSON, the answer's
model) holds the GIL the sampler needs to launch its kernels; at one request per episode
call, 512 episodes' 2,500 requests a step held it for seconds (``bench.trainer.ors_contention``
measures it). The submits and the deletes leave the rollout's critical path: an episode's
submit is sent when it ends (with the others ending that turn) and the rewards are a future
the trainer waits for with the other rewards (the next batch samples meanwhile); the deletes
follow the submits. A call the service could not answer (unavailable, timed out after
retries) makes that episode's reward null with its reason: masked, never 0.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from arbiter.envs import EnvsClient, ToolRefused
from arbiter.errors import ArbiterError
from arbiter.proto.envs import ToolOutput
from arbiter.proto.gateway import ScoreGroup
from arbiter.trainer.data import Problem
from arbiter.trainer.env import CALC_CALL, CalculatorEnv, Step
from arbiter.trainer.rewards import BatchRewards, GroupRewards

PREFIX = "ors:"
T = TypeVar("T")
# Episodes per batch request: the service runs one request's items in one of its processes,
# so a turn's requests spread over its processes.
CHUNK = 64


@dataclass
class EnvReward:
    reward: float | None
    error: str = ""  # why the reward is null


def _chunks(items: list[T], size: int) -> list[list[T]]:
    return [items[k : k + size] for k in range(0, len(items), size)]


class OrsBatch:
    """The episodes of one rollout batch on environment ``name`` (one per trajectory)."""

    stop_strings = CalculatorEnv.stop_strings

    def __init__(
        self,
        client: EnvsClient,
        name: str,
        pool: ThreadPoolExecutor,
        background: ThreadPoolExecutor,
        chunk: int = CHUNK,
    ):
        self.client, self.name, self.chunk = client, name, chunk
        # the rollout waits on ``pool`` (opens, calculator calls), never on ``background``
        # (submits, deletes), whose requests then never queue ahead of the next batch's opens
        self.pool, self.background = pool, background
        self.opening: list[Future[list[str | ArbiterError]]] = []  # one per chunk of episodes
        self.texts: list[str] = []
        # episodes whose reward is null already: never opened, or a call the service failed
        self.null: dict[int, EnvReward] = {}
        self.submits: list[tuple[list[int], Future[list[EnvReward]]]] = []
        self.ended: set[int] = set()

    def reset(self, problems: list[Problem]) -> list[str]:
        """One episode per problem (GSM8K's question and worked answer as its task), opened
        while the first turn samples; the first user messages, rendered as in process."""
        specs = [{"question": p.question, "answer": p.reference} for p in problems]
        # a task queued on the pool after these may wait for them: they started before it
        self.opening = [self.pool.submit(self._open, part) for part in _chunks(specs, self.chunk)]
        self.texts = [""] * len(problems)
        env = CalculatorEnv()
        return [env.reset(p) for p in problems]

    def _open(self, specs: list[dict[str, str]]) -> list[str | ArbiterError]:
        try:
            return self.client.open_many(self.name, specs)
        except ArbiterError as e:
            return [e] * len(specs)

    def sid(self, i: int) -> str | None:
        """Episode ``i``'s session id once opened; None when it could not be (reward null)."""
        got = self.opening[i // self.chunk].result()[i % self.chunk]
        if isinstance(got, ArbiterError):
            self.null.setdefault(i, EnvReward(None, f"create: {got}"))
            return None
        return got

    def _calls(
        self, tool: str, items: list[tuple[str, dict[str, str]]]
    ) -> list[ToolOutput | ArbiterError]:
        try:
            return self.client.call_many([(sid, self.name, tool, args) for sid, args in items])
        except ArbiterError as e:  # the whole request failed after its retries
            return [e] * len(items)

    def _send(
        self, tool: str, items: list[tuple[int, str, dict[str, str]]]
    ) -> list[tuple[list[int], Future[list[ToolOutput | ArbiterError]]]]:
        """``tool`` on each (episode, sid, input), ``chunk`` a request, all sent now."""
        out = []
        for k in range(0, len(items), self.chunk):
            part = items[k : k + self.chunk]
            calls = [(sid, args) for _, sid, args in part]
            out.append(([i for i, _, _ in part], self.pool.submit(self._calls, tool, calls)))
        return out

    def _observation(self, i: int, got: ToolOutput | ArbiterError) -> Step:
        if isinstance(got, ToolRefused):  # the policy's bad expression: its observation
            value, failed = f"error: {got}"[:200], True
        elif isinstance(got, ArbiterError):  # the service's failure, not the policy's
            self.null[i] = EnvReward(None, f"{got.kind}: {got}")
            return Step("", True)
        else:
            value = "".join(b.text for b in got.blocks).strip()
            failed = bool(got.metadata and "error" in got.metadata)
        obs = f"<result>{value}</result>"
        self.texts[i] += obs
        return Step(obs, False, tool_call=True, tool_error=failed)

    def step(self, actions: dict[int, tuple[str, bool]]) -> dict[int, Step]:
        """Each trajectory's turn (its action text, whether it ended at EOS) -> its Step:
        the turn's calculator calls at once; the others end their episodes (submits sent)."""
        out: dict[int, Step] = {}
        calling: list[tuple[int, str, dict[str, str]]] = []
        for i, (action, eos) in actions.items():
            self.texts[i] += action
            calls = CALC_CALL.findall(action)
            sid = None if eos or not calls or i in self.null else self.sid(i)
            if sid is None:
                out[i] = Step("", True)
            else:
                calling.append((i, sid, {"expression": calls[-1]}))
        for part, f in self._send("calculate", calling):
            for i, got in zip(part, f.result(), strict=True):
                out[i] = self._observation(i, got)
        self._end([i for i, step in out.items() if step.done])
        return out

    def _end(self, episodes: list[int]) -> None:
        """The episodes' submits, sent now; their rewards are collected by ``rewards``."""
        new = [i for i in episodes if i not in self.ended]
        self.ended.update(new)
        for part in _chunks(new, self.chunk):
            self.submits.append((part, self.background.submit(self._submit, part)))

    def _submit(self, part: list[int]) -> list[EnvReward]:
        """The episodes' submits, then (their rewards in) the episodes deleted: an episode
        open holds its bytes of the team's budget, which every ``/create`` adds up."""
        sids = {i: sid for i in part if (sid := self.sid(i)) is not None}
        live = [
            (i, sid, {"answer": self.texts[i]}) for i, sid in sids.items() if i not in self.null
        ]
        got: dict[int, EnvReward] = {}
        if live:
            done = self._calls("submit", [(sid, args) for _, sid, args in live])
            for (i, _, _), out in zip(live, done, strict=True):
                got[i] = _reward(out)
        if sids:
            with contextlib.suppress(ArbiterError):  # else left to the episodes' idle TTL
                self.client.delete_many(list(sids.values()))
        return [got.get(i) or self.null[i] for i in part]

    def rewards(self) -> Future[list[EnvReward]]:
        """Every episode's reward once its submit has answered (an episode still going after
        the last turn is submitted now)."""
        n = len(self.texts)
        self._end(list(range(n)))
        submits = list(self.submits)

        def collect() -> list[EnvReward]:
            got: dict[int, EnvReward] = {}
            for part, f in submits:
                got.update(zip(part, f.result(), strict=True))
            return [got[i] for i in range(n)]

        return _COLLECTOR.submit(collect)


def _reward(got: ToolOutput | ArbiterError) -> EnvReward:
    if isinstance(got, ToolRefused):
        return EnvReward(None, f"submit refused: {got}")
    if isinstance(got, ArbiterError):  # the service's failure, not the policy's
        return EnvReward(None, f"{got.kind}: {got}")
    return EnvReward(got.reward, "" if got.reward is not None else "submit returned no reward")


# Waits for a batch's submits (never on the pool it waits for, which could be full of them)
_COLLECTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ors-rewards")


class OrsEnvironments:
    """``env=ors:<name>``: a client and a few threads for the run (``requests``: batch
    requests in flight at once on the rollout's path, as many for the submits and deletes
    beside it); ``batch()`` per rollout."""

    def __init__(self, spec: str, base_url: str, api_key: str = "", requests: int = 8):
        self.name = spec.removeprefix(PREFIX)
        self.client = EnvsClient(base_url, api_key=api_key or None)
        self.pool = ThreadPoolExecutor(max_workers=requests, thread_name_prefix="ors")
        self.background = ThreadPoolExecutor(max_workers=requests, thread_name_prefix="ors-bg")

    def batch(self) -> OrsBatch:
        return OrsBatch(self.client, self.name, self.pool, self.background)

    def close(self) -> None:
        for pool in (self.pool, self.background):
            pool.shutdown(wait=False, cancel_futures=True)
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
