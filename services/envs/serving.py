"""The envs service's work, importable without FastAPI: discovery, episodes, tool calls.

Built once at start-up (``app.state.envs``). Every episode method takes the team (the
gateway's ``X-Arbiter-Team``) and the sid; the state is ``store.Store``'s.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from arbiter.errors import ArbiterError, BadRequest, NotFound, Timeout
from arbiter.proto.envs import (
    CreateEpisode,
    ListToolsOutput,
    RunToolError,
    RunToolSuccess,
    Split,
    TextBlock,
    ToolCall,
    Usage,
)
from arbiter.services.envs.calls import Calls, Claimer, Outcome
from arbiter.services.envs.environments import ENVIRONMENTS, Environment, ToolInputError
from arbiter.services.envs.rewards import Rewards
from arbiter.services.envs.settings import EnvsSettings
from arbiter.services.envs.store import Episode, Store
from arbiter.services.envs.tasks import checked, load_code, load_gsm8k

log = logging.getLogger("arbiter.envs")

TOOL_CALLS = Counter(
    "arbiter_envs_tool_calls_total",
    "Tool calls by environment, tool and outcome: ok, the ORS refusal's reason, or the error "
    "kind of a failure that was not the policy's (the call answered 503/504).",
    ["env", "tool", "outcome"],
)


@dataclass(frozen=True)
class Called:
    """A tool call's answer: the ORS result (JSON) and what it cost."""

    result: str
    usage: Usage
    outcome: str = "ok"  # the refusal's reason when the call was refused


@dataclass(frozen=True)
class Running:
    """A call started or attached to: its id, its outcome to come, and who reports its
    cost (``calls.sse_stream`` takes the three)."""

    task_id: str
    outcome: Awaitable[Outcome]
    claim: Claimer


class AfterRun(Exception):
    """A tool call that ran (its sandbox CPU is spent) but whose episode could not be saved:
    it was deleted, or opened again, while the call ran (409 ``session_busy``), or the state
    Redis failed (503). Its outcome is ``error`` with ``usage``, so the gateway charges what
    ran."""

    def __init__(self, error: ArbiterError, usage: Usage):
        super().__init__(error.message)
        self.error = error
        self.usage = usage


class Envs:
    def __init__(self, settings: EnvsSettings, store: Store, rewards: Rewards):
        self.settings = settings
        self.store = store
        self.rewards = rewards
        self.calls = Calls(store.redis, settings.call_timeout_s)
        gsm8k, self.gsm8k_check = load_gsm8k(settings.gsm8k_dir)
        if self.gsm8k_check != "ok":
            log.warning("GSM8K tasks not loaded: %s", self.gsm8k_check)
        code = load_code()
        self.envs: dict[str, Environment] = {}
        for cls in ENVIRONMENTS:
            if cls.needs_sandbox and settings.sandbox_url is None:
                continue  # not offered: no sandbox to run its code
            tasks = code if cls.name == "code" else gsm8k
            self.envs[cls.name] = cls(tasks, rewards, settings)

    # ---- discovery

    def env(self, name: str) -> Environment:
        found = self.envs.get(name.lower())
        if found is None:
            raise NotFound(
                f"env_name: unknown environment {name[:64]!r}; known: {', '.join(self.envs)}",
                param="env_name",
                code="unknown_environment",
            )
        return found

    def names(self) -> list[str]:
        return list(self.envs)

    def tools(self, name: str) -> ListToolsOutput:
        return ListToolsOutput(tools=[t.spec() for t in self.env(name).tools])

    def splits(self, name: str) -> list[Split]:
        return self.env(name).taskset.split_list()

    def tasks(self, name: str, split: str) -> list[dict[str, Any]]:
        return self.env(name).taskset.tasks(split)

    # ---- episodes

    @staticmethod
    def new_sid() -> str:
        return str(uuid.uuid4())

    async def create(self, team: str, sid: str, req: CreateEpisode) -> None:
        if req.toolset_name is not None:
            raise BadRequest("toolset_name: no toolsets are offered here", param="toolset_name")
        if req.env_name is None:
            raise BadRequest("env_name: name the environment", param="env_name")
        env = self.env(req.env_name)
        task: dict[str, Any]
        if req.task_spec is not None:
            task = checked(env.task_model, req.task_spec).model_dump(mode="json")
        else:
            assert req.split is not None and req.index is not None  # CreateEpisode checks
            task = env.taskset.task(req.split, req.index)
        await self.store.create(team, sid, Episode(env=env.name, task=task))

    async def delete(self, team: str, sid: str) -> None:
        """Forget the episode, then let go of what its tools hold (python: its interpreter;
        best effort: the sandbox reaps an idle one anyway)."""
        try:
            episode: Episode | None = await self.store.load(team, sid)
        except NotFound:
            episode = None
        await self.store.delete(team, sid)
        env = self.envs.get(episode.env) if episode is not None else None
        if env is not None and episode is not None and episode.tool_state:
            await env.close(episode.tool_state, team)

    async def prompt(self, team: str, sid: str, name: str) -> list[TextBlock]:
        episode = await self.store.load(team, sid)
        env = self._env_of(episode, name)
        return [TextBlock(text=env.prompt(episode.task))]

    async def call(self, team: str, sid: str, name: str, call: ToolCall) -> Running:
        """Starts the call (or, for a ``task_id`` already running or answered, attaches to
        it): what is wrong with the request itself (no episode, another environment) is
        raised here, before the first byte of the stream."""
        episode = await self.store.load(team, sid)
        env = self._env_of(episode, name)
        task_id = call.task_id or uuid.uuid4().hex
        if await self.calls.begin(team, sid, task_id):
            self.calls.start(team, sid, task_id, self._run(team, sid, env, call))
        outcome = self.calls.outcome(team, sid, task_id)
        return Running(task_id, outcome, Claimer(self.calls, team, sid, task_id))

    async def _run(self, team: str, sid: str, env: Environment, call: ToolCall) -> Outcome:
        """One run of the call, in the episode's turn, on the episode as the call before
        left it; a failure that was not the policy's is its outcome, never raised."""
        tool = env.tool(call.name)
        label = tool.name if tool is not None else "(unknown)"  # a caller's names stay out
        try:
            async with asyncio.timeout(self.settings.call_timeout_s), self.calls.lock(team, sid):
                episode = await self.store.load(team, sid)
                called = await self._call(team, sid, episode, env, call)
        except TimeoutError:
            TOOL_CALLS.labels(env.name, label, "timeout").inc()
            late = Timeout(
                f"the tool call did not finish within {self.settings.call_timeout_s:g} s "
                "(ENVS_CALL_TIMEOUT_S, its wait behind the episode's other calls included); "
                "retry",
                code="call_timeout",
            )
            return Outcome(None, late)
        except ArbiterError as exc:
            TOOL_CALLS.labels(env.name, label, exc.kind).inc()
            return Outcome(None, exc)
        except AfterRun as exc:
            TOOL_CALLS.labels(env.name, label, exc.error.kind).inc()
            return Outcome(None, exc.error, exc.usage)
        TOOL_CALLS.labels(env.name, label, called.outcome).inc()
        return Outcome(called.result, None, called.usage)

    async def _call(
        self, team: str, sid: str, episode: Episode, env: Environment, call: ToolCall
    ) -> Called:
        tool = env.tool(call.name)
        if tool is None:
            known = ", ".join(t.name for t in env.tools)
            return refused(f"name: no tool {call.name[:64]!r} in {env.name}; known: {known}",
                           "not_found")  # fmt: skip
        if episode.finished:
            return refused("the episode is finished (submit was called)", "episode_finished")
        try:
            args = env.args(tool, dict(call.input))
            step = await env.call(tool, args, episode.task, episode.tool_state, team)
        except ToolInputError as exc:
            return refused(str(exc), "input_validation")
        episode.calls += 1
        episode.finished = step.output.finished
        if step.tool_state is not None:
            episode.tool_state = step.tool_state
        usage = Usage(tool_calls=1, sandbox_cpu_ms=step.cpu_ms)
        try:
            await self.store.save(team, sid, episode)
        except ArbiterError as exc:
            raise AfterRun(exc, usage) from exc
        result = RunToolSuccess(output=step.output).model_dump_json()
        return Called(result, usage)

    async def task_tools(self, team: str, sid: str, name: str) -> ListToolsOutput:
        episode = await self.store.load(team, sid)
        return self.tools(self._env_of(episode, name).name)

    def _env_of(self, episode: Episode, name: str) -> Environment:
        """The episode's environment; ``name`` (a path's) must be it, "" (a bare route's)
        is it."""
        if name and name.lower() != episode.env:
            raise BadRequest(
                f"env_name: this episode is of {episode.env!r}, not {name[:64]!r}",
                param="env_name",
                code="wrong_environment",
            )
        return self.env(episode.env)


def refused(message: str, reason: Any) -> Called:
    """A tool call refused inside the ORS body (``ok: false``): it cost a call, no CPU."""
    body = RunToolError(error=message, reason=reason).model_dump_json()
    return Called(body, Usage(), outcome=reason)
