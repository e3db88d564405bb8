"""Rewards from the Arbiter gateway, fetched in the background while the GPU works.

``RewardClient.submit(recipe, groups)`` returns at once with a ``concurrent.futures.Future``;
the requests (one ``POST /v1/score`` per group) run on an asyncio event loop in a daemon
thread, through one ``arbiter.client.ArbiterClient``: its async pool (at most
``reward_concurrency`` requests in flight), its retry policy and its errors. The trainer
computes reference/old log-probs meanwhile and then blocks on ``result()``; the time it
still blocks is the reward wait it logs.

Failure policy (``arbiter.errors``): the client retries what may heal (connect errors,
timeouts, 429 after its ``Retry-After``, every 5xx) with exponential back-off and jitter,
each group's request with one ``Idempotency-Key`` on all its tries (a retry after a dropped
connection gets the gateway's stored answer and is counted once in the team's usage and
quota). When a group still fails that way, the whole batch fails with ``RewardsUnavailable``
(an ``Unavailable``) and the trainer skips it: it never trains on invented rewards.
Anything else stops the run as it came: a 4xx other than 429 is a bug in the request or
the recipe (``InvalidRequest``: ``Unprocessable`` for an unknown recipe, ``NotConfigured``
for a recipe whose component the gateway has not configured, ``Unauthorized``), and a 200
whose body is not a ``ScoreResponse`` is ``BadResponse`` (the same request would get the
same body). ``check_recipes`` asks ``GET /v1/recipes`` once at start, before a model is
loaded. The API key is the trainer's ``api_key`` setting, else ``$ARBITER_API_KEY``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from arbiter.client import ArbiterClient, RecipeArg, RetryPolicy
from arbiter.errors import ArbiterError, Unavailable
from arbiter.proto.gateway import ScoreGroup, ScoreResponse
from arbiter.trainer.config import TrainerConfig

log = logging.getLogger(__name__)

# The start check asks twice at most, each try within 10 s: a gateway that is down only
# warns (the loop rides out an outage), so there is no point waiting long for it.
START_CHECK_RETRY = RetryPolicy(attempts=2)
START_CHECK_TIMEOUT_S = 10.0


class RewardsUnavailable(Unavailable):
    """A group's request still failed retryably (gateway down, 5xx, 429) after the retries."""


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


def gateway_client(cfg: TrainerConfig) -> ArbiterClient:
    """The trainer's client of the gateway: each try within ``reward_timeout_s``,
    ``reward_retries`` retries from ``reward_backoff_s`` (the client's ``RetryPolicy``), a
    pool of ``reward_concurrency`` connections (as many requests in flight)."""
    retry = RetryPolicy(attempts=cfg.reward_retries + 1, base_delay=cfg.reward_backoff_s)
    return ArbiterClient(
        cfg.gateway_url,
        api_key=cfg.api_key or None,
        timeout=cfg.reward_timeout_s,
        retry=retry,
        max_connections=cfg.reward_concurrency,
    )


def check_recipes(cfg: TrainerConfig) -> None:
    """The start check of ``recipe`` (and ``eval_recipe`` when evaluating): one
    ``GET /v1/recipes``. A recipe the gateway cannot serve (unknown there, or a component
    it has not configured: ``NotConfigured``) and a refused key raise the gateway's
    ``InvalidRequest``, and the run stops before loading a model. A gateway that cannot be
    reached only warns: the loop rides out an outage (batches skipped)."""
    recipes = [cfg.recipe, cfg.eval_recipe] if cfg.eval_every else [cfg.recipe]
    log.info("rewards from the gateway at %s", cfg.gateway_url)
    client = ArbiterClient(
        cfg.gateway_url,
        api_key=cfg.api_key or None,
        timeout=START_CHECK_TIMEOUT_S,
        retry=START_CHECK_RETRY,
    )
    with client:
        for recipe in [r for i, r in enumerate(recipes) if r not in recipes[:i]]:
            client.check_recipe(recipe, unreachable="warn")


class RewardClient:
    """Scores batches in the background through ``client``; see the module docstring.

    ``RewardClient.from_config(cfg)`` is the trainer's; it owns the client and closes it."""

    def __init__(self, client: ArbiterClient) -> None:
        self.client = client
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="rewards", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, cfg: TrainerConfig) -> RewardClient:
        return cls(gateway_client(cfg))

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def submit(self, recipe: RecipeArg, groups: list[ScoreGroup]) -> Future[BatchRewards]:
        """Start scoring ``groups`` (one request each); returns immediately."""
        return asyncio.run_coroutine_threadsafe(self._score_batch(recipe, groups), self._loop)

    def score(self, recipe: RecipeArg, groups: list[ScoreGroup]) -> BatchRewards:
        return self.submit(recipe, groups).result()

    async def _score_batch(self, recipe: RecipeArg, groups: list[ScoreGroup]) -> BatchRewards:
        t0 = time.perf_counter()
        # one task per group; the client keeps at most reward_concurrency of them sending
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

    async def _score_group(self, recipe: RecipeArg, group: ScoreGroup) -> ScoreResponse:
        try:
            return await self.client.ascore([group], recipe)
        except ArbiterError as e:
            if not e.retryable:  # the request's fault or a broken answer: stop the run
                raise
            raise RewardsUnavailable(f"group {group.id!r}: {e.message}") from e

    def close(self) -> None:
        """Close the client's pools and stop the thread (a second call does nothing)."""
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.client.aclose(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
