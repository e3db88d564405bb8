"""Rewards from the Arbiter gateway, fetched in the background while the GPU works.

``RewardClient.submit(groups)`` returns at once with a ``concurrent.futures.Future``; the
requests (one ``POST /v1/score`` per group, at most ``concurrency`` in flight) run on an
asyncio event loop in a daemon thread with one shared ``httpx.AsyncClient``. The trainer
computes reference/old log-probs meanwhile and then blocks on ``result()``; the time it
still blocks is the reward wait it logs.

Failure policy (``arbiter.errors``): connect errors, timeouts, 429 and every 5xx are
retried with exponential backoff (at least a 429's ``Retry-After``: a team's quota); when
retries run out the whole batch fails with ``RewardsUnavailable`` (an ``Unavailable``) and
the trainer skips it (never trains on invented rewards). A 4xx other than 429 is a bug in
the request or the recipe: the gateway's ``InvalidRequest`` (e.g. ``Unprocessable`` for an
unknown recipe, ``NotConfigured`` for a recipe whose component the gateway has not
configured) is raised as it came, and stops the run. ``check_recipe`` asks the same of
``GET /v1/recipes`` once at start, before a model is loaded.

Every group's request carries an ``Idempotency-Key`` (a fresh UUID), the same on each of
its retries: a retry after a dropped connection gets the gateway's stored answer and is
counted once in the team's usage and quota. The API key is ``api_key`` (the trainer's
``api_key`` setting), else ``$ARBITER_API_KEY``, sent as ``Authorization: Bearer``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import httpx

from arbiter.client import ArbiterClient, RetryPolicy
from arbiter.errors import (
    ArbiterError,
    BadResponse,
    InvalidRequest,
    Timeout,
    Unavailable,
    from_response,
)
from arbiter.proto.gateway import Recipe, ScoreGroup, ScoreRequest, ScoreResponse

log = logging.getLogger(__name__)


class RewardsUnavailable(Unavailable):
    """The gateway could not be reached (or kept failing) past the retry limit."""


@dataclass
class GroupRewards:
    """One group's rewards: ``rewards[j]`` is None when response j is masked/null."""

    id: str
    rewards: list[float | None]
    components: dict[str, list[float | None]]
    masked: list[bool]
    errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class BatchRewards:
    groups: list[GroupRewards]
    recipe_name: str
    fingerprint: str
    elapsed_s: float  # submit -> last response

    def flat(self) -> list[float]:
        """All rewards, group-major, NaN where null or masked."""
        out: list[float] = []
        for g in self.groups:
            for r, m in zip(g.rewards, g.masked, strict=True):
                out.append(math.nan if (r is None or m) else float(r))
        return out

    def error_kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for g in self.groups:
            for e in g.errors:
                counts[e["kind"]] = counts.get(e["kind"], 0) + 1
        return counts

    def first_reason(self, kind: str) -> str:
        """``component: message`` of the first null of ``kind`` (for the log)."""
        for g in self.groups:
            for e in g.errors:
                if e["kind"] == kind:
                    return f"{e['component']}: {e['message']}"[:500]
        return "no reason given"

    def component_names(self) -> list[str]:
        names: dict[str, None] = {}
        for g in self.groups:
            names.update(dict.fromkeys(g.components))
        return list(names)

    def flat_component(self, name: str) -> list[float]:
        out: list[float] = []
        for g in self.groups:
            scores: list[float | None] = g.components.get(name) or [None] * len(g.rewards)
            out.extend(math.nan if s is None else float(s) for s in scores)
        return out


def check_recipe(
    base_url: str,
    recipe: str | dict[str, Any] | Recipe,
    *,
    api_key: str = "",
    timeout_s: float = 10.0,
) -> None:
    """The start check: one ``GET /v1/recipes``. A recipe the gateway cannot serve (unknown
    there, or a component it has not configured: ``NotConfigured``) and a refused key raise
    the gateway's ``InvalidRequest``, and the run stops before loading a model. A gateway
    that cannot be reached only warns: the loop rides out an outage (batches skipped)."""
    client = ArbiterClient(
        base_url, api_key=api_key or None, timeout=timeout_s, retry=RetryPolicy(attempts=2)
    )
    try:
        client.check_recipe(recipe)
    except InvalidRequest:
        raise
    except ArbiterError as e:
        log.warning("could not check the recipe at start (%s); starting anyway", e.message)
    finally:
        client.close()


def _recipe(recipe: str | dict[str, Any] | Recipe) -> str | Recipe:
    if isinstance(recipe, (str, Recipe)):
        return recipe
    return Recipe.model_validate(recipe)


def _retry_after(resp: httpx.Response) -> float:
    """A 429's ``Retry-After`` in seconds (capped at 120), else 0."""
    try:
        return min(120.0, max(0.0, float(resp.headers.get("retry-after", 0))))
    except ValueError:  # an HTTP date: the back-off alone
        return 0.0


class RewardClient:
    """Background-thread client for ``POST /v1/score``; see the module docstring."""

    def __init__(
        self,
        base_url: str,
        *,
        concurrency: int = 16,
        timeout_s: float = 120.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        api_key: str = "",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        api_key = api_key or os.environ.get("ARBITER_API_KEY", "")
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="rewards", daemon=True)
        self._thread.start()
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        asyncio.run_coroutine_threadsafe(self._setup(), self._loop).result()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def _setup(self) -> None:
        limits = httpx.Limits(
            max_connections=self.concurrency, max_keepalive_connections=self.concurrency
        )
        self._client = httpx.AsyncClient(
            timeout=self.timeout_s, limits=limits, headers=self.headers
        )
        self._sem = asyncio.Semaphore(self.concurrency)

    def submit(
        self, recipe: str | dict[str, Any] | Recipe, groups: list[ScoreGroup]
    ) -> Future[BatchRewards]:
        """Start scoring ``groups`` (one request each); returns immediately."""
        return asyncio.run_coroutine_threadsafe(
            self._score_batch(_recipe(recipe), groups), self._loop
        )

    def score(
        self, recipe: str | dict[str, Any] | Recipe, groups: list[ScoreGroup]
    ) -> BatchRewards:
        return self.submit(recipe, groups).result()

    async def _score_batch(self, recipe: str | Recipe, groups: list[ScoreGroup]) -> BatchRewards:
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(self._score_group(recipe, g)) for g in groups]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            raise
        fingerprints = {r.recipe.fingerprint for r in results}
        if len(fingerprints) > 1:
            log.warning("recipe fingerprint changed within one batch: %s", sorted(fingerprints))
        out = [
            GroupRewards(
                id=g.id,
                rewards=list(g.rewards),
                components={k: list(v) for k, v in g.components.items()},
                masked=list(g.masked),
                errors=[e.model_dump() for e in g.errors],
            )
            for r in results
            for g in r.groups
        ]
        return BatchRewards(
            groups=out,
            recipe_name=results[0].recipe.name,
            fingerprint=results[0].recipe.fingerprint,
            elapsed_s=time.perf_counter() - t0,
        )

    async def _score_group(self, recipe: str | Recipe, group: ScoreGroup) -> ScoreResponse:
        assert self._client is not None and self._sem is not None
        body = ScoreRequest(recipe=recipe, groups=[group]).model_dump(mode="json")
        url = f"{self.base_url}/v1/score"
        headers = {"Idempotency-Key": uuid.uuid4().hex}  # the same on every retry
        last: ArbiterError = Unavailable("no attempt made")
        retry_after = 0.0  # a 429's Retry-After (a team's quota): wait at least that long
        for attempt in range(self.retries + 1):
            if attempt:
                delay = max(min(30.0, self.backoff_s * 2 ** (attempt - 1)), retry_after)
                log.info("gateway retry %d/%d in %.1fs (%s)", attempt, self.retries, delay, last)
                await asyncio.sleep(delay)
            try:
                async with self._sem:
                    resp = await self._client.post(url, json=body, headers=headers)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                unreachable = Timeout if isinstance(e, httpx.TimeoutException) else Unavailable
                last = unreachable(f"{type(e).__name__}: {e}")
                continue
            if resp.status_code == 200:
                try:
                    return ScoreResponse.model_validate_json(resp.content)
                except ValueError as e:  # e.g. a proxy's page: retried like an outage
                    last = BadResponse(f"bad response body: {e}"[:500])
                    continue
            last = from_response(resp.status_code, resp.content, source="gateway")
            retry_after = _retry_after(resp)
            if isinstance(last, InvalidRequest):  # the request's fault: retrying cannot help
                raise last
        raise RewardsUnavailable(
            f"gateway {self.base_url} failed after {self.retries + 1} attempts: {last}"
        ) from last

    def close(self) -> None:
        async def _close() -> None:
            if self._client is not None:
                await self._client.aclose()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(_close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
