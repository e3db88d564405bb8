"""The work behind ``POST /v1/score``, one step per module, in the order they run.

1. ``plan.py``: a result table per recipe component, with the cache keys of its work.
2. ``lookup.py``: every component's keys in one cache round trip (one Redis MGET).
3. ``misses.py``: what is missing, de-duplicated within each group, in chunks of groups.
4. ``fanout.py``: the chunks, to every component concurrently (``ComponentClient``).
5. ``merge.py``: the answers back into exactly the response indices they came from.
6. ``render.py``: weighted rewards and the response body.

New scores are written to the cache after the response is sent (``Scorer.finish``), and
the request's counters go to the team's usage ledger (``after``, set by ``teams.py``).

Cache scope: a request scored for a ``team`` reads and writes that team's cache space,
unless its recipe says ``cache: shared``; without a team (auth off) every request shares
one space.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from typing import NamedTuple, ParamSpec, TypeVar

from prometheus_client import Counter

from arbiter.errors import ArbiterError, InvalidRequest, Timeout, Unavailable
from arbiter.proto.components import ScoreGroup
from arbiter.proto.gateway import ScoreRequest
from arbiter.services.common.app import NON_BLOCKING_PREFIXES
from arbiter.services.gateway.cache import Cache
from arbiter.services.gateway.fanout import ComponentClient, not_configured
from arbiter.services.gateway.lookup import CHUNK_KEYS, lookup
from arbiter.services.gateway.merge import failure_error, merge
from arbiter.services.gateway.misses import Call, call, chunks, misses
from arbiter.services.gateway.plan import ComponentScores, plan
from arbiter.services.gateway.recipes import RecipeBook
from arbiter.services.gateway.render import render
from arbiter.services.gateway.usage import tally

REQUESTS = Counter(
    "arbiter_gateway_score_requests_total", "POST /v1/score by recipe and outcome.",
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


class Scored(NamedTuple):
    body: bytes  # the serialised ScoreResponse
    writes: list[tuple[str, str]]  # new cache entries, to store once the body is sent
    team: str | None = None  # who it was scored for (None: auth off)
    counts: Tally[str] | None = None  # the usage ledger's counters of this request


After = Callable[[Scored], Awaitable[None]]


class Scorer:
    """Built once at start-up (app.state.scorer); one call per ``/v1/score`` request."""

    def __init__(self, book: RecipeBook, cache: Cache, client: ComponentClient, enabled: bool):
        self.book = book
        self.cache = cache
        self.client = client
        self.cache_enabled = enabled
        # Scores answered but not yet in Redis (the store runs after the response is sent):
        # served from here so this process always sees its own writes.
        self._pending: dict[str, str] = {}
        self.after: After | None = None  # usage and judge-token charging (teams.py)

    async def score(self, req: ScoreRequest, team: str | None = None) -> Scored:
        """Score ``req`` for ``team`` (its cache space unless the recipe is shared)."""
        label = req.recipe if isinstance(req.recipe, str) else "inline"
        try:
            scored = await self._score(req, team)
        except InvalidRequest:
            REQUESTS.labels(label if label in self.book.names else "unknown", "invalid").inc()
            raise
        except (Unavailable, Timeout):
            REQUESTS.labels(label, "failed").inc()
            raise
        REQUESTS.labels(label, "ok").inc()
        return scored

    async def _score(self, req: ScoreRequest, team: str | None) -> Scored:
        start = time.perf_counter()
        recipe = self.book.get(req.recipe)  # 422 for an unknown recipe or bad params
        scope = None if recipe.ref.cache == "shared" else team
        # A big request's CPU-bound steps run on a worker thread: the event loop, which gets
        # the GIL back every few ms, keeps answering other callers meanwhile (a maximal
        # request stalled them for seconds when every step ran on the loop).
        n = sum(len(g.responses) for g in req.groups)
        run = asyncio.to_thread if n >= THREAD_RESPONSES else _inline
        comps = await run(plan, recipe, req.groups, scope)
        await self._lookup(comps, req.groups)
        calls, failures = await run(self._calls, comps, req.groups)
        results = await asyncio.gather(*(self.client.call(c.spec, c.body) for c in calls))
        merged = await run(merge, comps, calls, results)
        merged.failures[:0] = failures
        if not self.cache_enabled:
            merged.writes.clear()
        if merged.failures and req.on_error == "fail":
            await self.store(merged.writes)
            raise failure_error(merged.failures)
        self._remember(merged.writes)
        body = await run(render, recipe, req.groups, comps, merged, time.perf_counter() - start)
        counts = None
        if self.after is not None:
            counts = tally(comps, req.groups, merged.prompt_tokens, merged.completion_tokens)
        return Scored(body, merged.writes, team, counts)

    async def _lookup(self, comps: list[ComponentScores], groups: list[ScoreGroup]) -> None:
        if self.cache_enabled:
            live = [c for c in comps if self.client.url(c.bound.spec) is not None]
            await lookup(self.cache, self._pending, live, groups)

    def _calls(
        self, comps: list[ComponentScores], groups: list[ScoreGroup]
    ) -> tuple[list[Call], list[ArbiterError]]:
        """The calls to make; a component whose service is not configured fails at once."""
        calls: list[Call] = []
        failures: list[ArbiterError] = []
        limits = (self.client.settings.batch_groups, self.client.settings.batch_responses)
        for comp in comps:
            items = misses(comp, groups)
            if self.client.url(comp.bound.spec) is None:
                failure = not_configured(comp.bound.spec)
                failures.append(failure)
                for item in items:
                    comp.fail(item, failure.kind, failure.message)
                continue
            calls.extend(call(comp, chunk, groups) for chunk in chunks(items, *limits))
        return calls, failures

    def _remember(self, writes: list[tuple[str, str]]) -> None:
        if len(self._pending) > MAX_PENDING:  # only if background writes never ran
            self._pending.clear()
        self._pending.update(writes)

    async def store(self, writes: list[tuple[str, str]]) -> None:
        """Write new scores to the cache; runs after the response has been sent."""
        try:
            for i in range(0, len(writes), CHUNK_KEYS):  # the loop runs between round trips
                await self.cache.set_many(writes[i : i + CHUNK_KEYS])
        finally:
            for key, value in writes:
                if self._pending.get(key) == value:
                    del self._pending[key]

    async def finish(self, scored: Scored) -> None:
        """After the response: store new scores, then record the usage (``after``)."""
        if scored.writes:
            await self.store(scored.writes)
        if self.after is not None and scored.counts is not None:
            await self.after(scored)

    async def ready(self) -> dict[str, str]:
        services = ("verify", "embedding", "judge")
        overrides = self.client.settings.component_urls
        checks = await asyncio.gather(
            *(self.client.ready(s) for s in services),
            *(self.client.ready_url(url) for url in overrides.values()),
            self.cache.check(),
        )
        names = [*services, *(f"{name} (GATEWAY_COMPONENT_URLS)" for name in overrides), "cache"]
        # A component that is down degrades the gateway (its scores come back null + masked)
        # but does not take it out of service: math and format keep flowing while vLLM restarts.
        return {
            name: check if check == "ok" or check.startswith(NON_BLOCKING_PREFIXES)
            else f"degraded: {check}"
            for name, check in zip(names, checks, strict=True)
        }  # fmt: skip
