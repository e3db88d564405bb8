"""The scoring step of a scoring call: pure work on a resolved recipe, one module per step.

The scoring core the gateway and the envs service share (both build a ``Scorer``; neither
imports the other's modules):

1. ``plan.py``: a result table per recipe component, with the cache keys of its work.
2. ``lookup.py``: every component's keys in one cache round trip (one Redis MGET).
3. ``misses.py``: what is missing, de-duplicated within each group, in chunks of groups.
4. ``fanout.py``: the chunks, to every component concurrently (``ComponentClient``), each
   call in its team's fair share of the component's slots.
5. ``merge.py``: the answers back into exactly the response indices they came from, and
   the weighted rewards.

``Scorer.score(recipe, groups, scope)`` knows no caller, quota or bytes: it returns a typed
``Scored``. In the gateway, admission before it and settlement and rendering after it are
``gateway.lifecycle``'s (``gateway.render`` makes the bytes of ``/v1/score``; the compat
routes read their samples out of the same ``Scored``); the envs service scores an
episode's submit with it directly (``envs.rewards``).

``Scope`` says whose work it is: the team (the fan-out's fair share and the
``X-Arbiter-Team`` header), the cache space (the team's, or None: a shared recipe or auth
off), and ``Progress``, where the fan-out marks each response whose work reached a
component, so a request that fails or is left is charged for exactly that work.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from prometheus_client import Counter

from arbiter.errors import ArbiterError, InvalidRequest, Unavailable
from arbiter.keys import ANONYMOUS
from arbiter.proto.components import ScoreGroup
from arbiter.services.common.app import NON_BLOCKING_PREFIXES
from arbiter.services.scoring.cache import Cache
from arbiter.services.scoring.fanout import UNREACHABLE, Caller, CallResult, ComponentClient
from arbiter.services.scoring.grading import GRADERS, LocalGraders
from arbiter.services.scoring.lookup import CHUNK_KEYS, lookup
from arbiter.services.scoring.merge import Merged, join_notes, merge, weigh
from arbiter.services.scoring.misses import Call, call, chunks, misses
from arbiter.services.scoring.plan import ComponentScores, plan
from arbiter.services.scoring.recipes import ResolvedRecipe
from arbiter.services.scoring.reward_metrics import SCORES
from arbiter.services.scoring.settings import SERVICES

REQUESTS = Counter(
    "arbiter_gateway_score_requests_total", "Scoring calls by recipe and outcome.",
    ["recipe", "outcome"],
)  # fmt: skip

MAX_PENDING = 200_000
# Responses from which a request's CPU-bound steps leave the event loop (see _score);
# below it the thread hop costs more than the step.
THREAD_RESPONSES = 4096

P = ParamSpec("P")
R = TypeVar("R")


async def _inline(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    return fn(*args, **kwargs)


class Progress:
    """Which responses' work reached a component: ``(group, index)`` with a count of the
    calls that carried it (a response is in one call per component)."""

    def __init__(self) -> None:
        self._calls: Tally[tuple[int, int]] = Tally()

    def start(self, where: Iterable[tuple[int, int]]) -> None:
        self._calls.update(where)

    def undo(self, where: Iterable[tuple[int, int]]) -> None:
        self._calls.subtract(where)

    def started(self, where: tuple[int, int]) -> bool:
        return self._calls[where] > 0

    @property
    def count(self) -> int:
        return sum(1 for n in self._calls.values() if n > 0)


@dataclass(frozen=True)
class Scope:
    """Whose work one scoring call is (see the module docstring)."""

    team: str = ANONYMOUS
    cache: str | None = None
    progress: Progress = field(default_factory=Progress)
    weight: int = 1  # the team's share of a component's slots (keys file; common.fairshare)


@dataclass(frozen=True)
class Scored:
    """A scored request: the filled plan, the weighted rewards, what to cache."""

    recipe: ResolvedRecipe
    groups: list[ScoreGroup]
    comps: list[ComponentScores]
    merged: Merged
    rewards: list[list[float | None]]  # (groups, responses)
    reward_errors: list[list[tuple[int, str, str]]]  # per group: (index, kind, message)
    elapsed_s: float

    @property
    def writes(self) -> list[tuple[str, str]]:
        return self.merged.writes

    def totals(self) -> dict[str, int]:
        """The request's usage counts: the answer's ``usage`` and the ledger's, both."""
        responses = sum(len(g.responses) for g in self.groups)
        hits = sum(c.hits for c in self.comps)
        return {
            "responses": responses,
            "cache_hits": hits,
            "cache_misses": responses * len(self.comps) - hits,
            "judge_prompt_tokens": self.merged.prompt_tokens,
            "judge_completion_tokens": self.merged.completion_tokens,
            "sandbox_cpu_ms": round(self.merged.cpu_ms),
        }

    @property
    def failures(self) -> list[ArbiterError]:
        return self.merged.failures


def _positions(c: Call) -> list[tuple[int, int]]:
    return [(item.g, j) for item in c.items for pos in item.positions for j in pos]


class Scorer:
    """Built once at start-up (the gateway's ``app.state.scorer``, the envs service's
    ``Rewards``); one ``score`` per scoring call."""

    def __init__(self, cache: Cache, client: ComponentClient):
        self.cache = cache
        self.client = client
        self.graders = LocalGraders(client)  # grader components, graded here (grading.py)
        # GATEWAY_CACHE_ENABLED=false is a NullCache (app.build_cache): the one decision
        self.cache_enabled = cache.kind != "off"
        # Scores answered but not yet in Redis (the store runs beside the answer): served
        # from here so this process always sees its own writes.
        self._pending: dict[str, str] = {}

    async def score(self, recipe: ResolvedRecipe, groups: list[ScoreGroup], scope: Scope) -> Scored:
        """Score ``groups`` of an admitted ``recipe``: admission (``gateway.lifecycle``) refused
        any recipe with a component whose service is not configured. An ``InvalidRequest``
        (params a component refused) is the only error raised: a failed component is nulls
        with their reasons in ``Scored``."""
        label = recipe.label
        try:
            scored = await self._score(recipe, groups, scope)
        except InvalidRequest:
            REQUESTS.labels(label, "invalid").inc()
            raise
        REQUESTS.labels(label, "failed" if scored.failures else "ok").inc()
        return scored

    async def _score(
        self, recipe: ResolvedRecipe, groups: list[ScoreGroup], scope: Scope
    ) -> Scored:
        start = time.perf_counter()
        # A big request's CPU-bound steps run on a worker thread: the event loop, which gets
        # the GIL back every few ms, keeps answering other callers meanwhile. On the loop, a
        # maximal request would stall them for seconds.
        n = sum(len(g.responses) for g in groups)
        run = asyncio.to_thread if n >= THREAD_RESPONSES else _inline
        comps = await run(plan, recipe, groups, scope.cache)
        if self.cache_enabled:
            await lookup(self.cache, self._pending, comps, groups)
        calls = await run(self._calls, comps, groups)
        results = await asyncio.gather(*(self._call(c, scope) for c in calls))
        merged = await run(merge, comps, calls, results)
        join_notes(comps, groups)
        if not self.cache_enabled:
            merged.writes.clear()
        rewards, reward_errors = await run(weigh, comps, groups)
        SCORES.observe_rewards(recipe.label, (r for rs in rewards for r in rs))
        for c in comps:
            SCORES.observe_component(c.bound.spec.metric_label, (s for ss in c.scores for s in ss))
        elapsed = time.perf_counter() - start
        return Scored(recipe, groups, comps, merged, rewards, reward_errors, elapsed)

    async def _call(self, c: Call, scope: Scope) -> CallResult:
        """One component call; its responses count as started once the call reached the
        component (or was in flight when the request was cancelled)."""
        where = _positions(c)
        reached = False

        def sent() -> None:
            nonlocal reached
            reached = True
            scope.progress.start(where)

        client: Caller = self.graders if c.spec.service == GRADERS else self.client
        result = await client.call(
            c.spec, c.body, scope.team, id(scope.progress), sent, scope.weight
        )
        if reached and isinstance(result, Unavailable) and result.code == UNREACHABLE:
            scope.progress.undo(where)  # no connection: nothing reached the component
        return result

    def _calls(self, comps: list[ComponentScores], groups: list[ScoreGroup]) -> list[Call]:
        """The calls to make: each component's misses, in chunks."""
        limits = (self.client.settings.batch_groups, self.client.settings.batch_responses)
        return [
            call(comp, chunk, groups)
            for comp in comps
            for chunk in chunks(misses(comp, groups), *limits)
        ]

    def remember(self, writes: list[tuple[str, str]]) -> None:
        """New scores, visible to this process's next lookups until ``store`` ran."""
        if len(self._pending) > MAX_PENDING:  # only if background writes never ran
            self._pending.clear()
        self._pending.update(writes)

    async def store(self, writes: list[tuple[str, str]]) -> None:
        """Write new scores to the cache (settle's last step)."""
        try:
            for i in range(0, len(writes), CHUNK_KEYS):  # the loop runs between round trips
                await self.cache.set_many(writes[i : i + CHUNK_KEYS])
        finally:
            for key, value in writes:
                if self._pending.get(key) == value:
                    del self._pending[key]

    async def ready(self) -> dict[str, str]:
        services = SERVICES
        overrides = self.client.settings.component_urls
        checks = await asyncio.gather(
            *(self.client.ready(s) for s in services),
            *(self.client.ready_url(url) for url in overrides.values()),
            self.cache.check(),
        )
        names = [*services, *(f"{name} (GATEWAY_COMPONENT_URLS)" for name in overrides), "cache"]
        # A component that is down degrades the service (its scores come back null + masked)
        # but does not take it out of service: math and format keep flowing while vLLM restarts.
        return {
            name: check if check == "ok" or check.startswith(NON_BLOCKING_PREFIXES)
            else f"degraded: {check}"
            for name, check in zip(names, checks, strict=True)
        }  # fmt: skip
