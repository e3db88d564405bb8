"""One deployment, many teams: the checks and records around every scoring call.

``Teams`` is built once at start-up (``app.state.teams``) on its own Redis pool; every
scoring route goes through a ``Tenant`` (the caller plus ``Teams``):

1. ``POST /v1/score`` with an ``Idempotency-Key``: an earlier answer for the same key and
   body is sent again as it was (``idempotency.py``), with nothing counted;
2. ``admit``: the team's allow-lists (403) and quotas (429 with ``Retry-After``,
   ``quota.py``), before any work;
3. the scoring itself (``Scorer.score`` in the team's cache space);
4. afterwards the usage ledger (``usage.py``) and the judge tokens the judge reported are
   charged to the team's daily quota (``Scorer.after``).

A request that fails or whose client leaves after step 2 gives its responses back to the
quota and releases its idempotency key, so the retry is counted once. Auth off (no
``GATEWAY_KEYS_FILE``): no quotas and no ledger; idempotency still works when Redis is set.
"""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from dataclasses import dataclass
from datetime import date

from fastapi import Request
from redis.asyncio import BlockingConnectionPool, Redis
from starlette.background import BackgroundTask

from arbiter.errors import Forbidden, RateLimited
from arbiter.keys import Principal, Team
from arbiter.proto.gateway import ScoreRequest
from arbiter.proto.usage import UsageReport
from arbiter.services.common.responses import JSONBody
from arbiter.services.gateway.auth import KeyStore, principal
from arbiter.services.gateway.idempotency import REPLAYED, Claim, Idempotency, Replay, check_key
from arbiter.services.gateway.quota import Quota
from arbiter.services.gateway.recipes import ResolvedRecipe
from arbiter.services.gateway.scoring import Scored, Scorer
from arbiter.services.gateway.settings import GatewaySettings
from arbiter.services.gateway.usage import Ledger


class Teams:
    def __init__(self, settings: GatewaySettings, store: KeyStore | None):
        self.store = store
        self.redis: Redis | None = None
        self.quota: Quota | None = None
        self.ledger: Ledger | None = None
        self.idempotency: Idempotency | None = None
        if settings.redis_url:
            pool = BlockingConnectionPool.from_url(
                settings.redis_url,
                max_connections=settings.redis_max_connections,
                timeout=settings.redis_timeout_s,
                socket_timeout=settings.redis_timeout_s,
                socket_connect_timeout=settings.redis_timeout_s,
            )
            self.redis = Redis(connection_pool=pool)
            self.idempotency = Idempotency(
                self.redis, settings.idempotency_ttl_s, settings.idempotency_wait_s
            )
            if store is not None:
                self.quota = Quota(self.redis)
                self.ledger = Ledger(self.redis, settings.usage_retention_days)

    def attach(self, scorer: Scorer) -> None:
        """Usage and judge tokens of every scored request go to its team."""
        if self.ledger is not None:
            scorer.after = self.after

    async def after(self, scored: Scored) -> None:
        """Usage and judge tokens of a scored request, to its team (auth on)."""
        if scored.team is None or scored.counts is None:
            return
        await self.record(scored.team, scored.counts)

    async def record(self, team: str, counts: Tally[str]) -> None:
        if self.ledger is not None:
            await self.ledger.add(team, counts)
        tokens = counts.get("judge_prompt_tokens", 0) + counts.get("judge_completion_tokens", 0)
        if self.quota is not None and self.store is not None and tokens:
            limits = self.store.index().teams.get(team, Team())
            await self.quota.charge(Principal(team, None, False, limits), tokens)

    async def usage(self, who: Principal, start: date, end: date, team: str | None) -> UsageReport:
        if self.ledger is None:
            return UsageReport(start=start, end=end, days=[])
        if team is not None and team != who.team and not who.admin:
            raise Forbidden(
                f"team: only an admin key reads another team's usage (yours: {who.team})",
                param="team",
                code="admin_only",
            )
        teams = [team] if team is not None else (None if who.admin else [who.team])
        return await self.ledger.report(start, end, teams)

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()


@dataclass(frozen=True)
class Tenant:
    """The caller of one request, with the deployment's ``Teams``."""

    who: Principal
    teams: Teams

    @property
    def team(self) -> str | None:
        """The cache space and ledger entry: None when auth is off (one shared space)."""
        return self.who.team if self.teams.store is not None else None

    async def admit(self, recipe: ResolvedRecipe, label: str, responses: int) -> None:
        """Allow-lists (403), then quotas (429/413); ``label`` is the recipe's name, or
        ``inline`` for an inline recipe."""
        who = self.who
        if not who.may_use_recipe(label):
            raise Forbidden(
                f"recipe: team {who.team} may not use recipe {label!r}",
                param="recipe",
                code="recipe_not_allowed",
            )
        for comp in recipe.components:
            if not who.may_use_component(comp.spec.name):
                raise Forbidden(
                    f"recipe: team {who.team} may not use component {comp.spec.name!r}",
                    param="recipe",
                    code="component_not_allowed",
                )
        if self.teams.quota is not None:
            uses_judge = any(c.spec.service == "judge" for c in recipe.components)
            try:
                await self.teams.quota.take(who, responses, uses_judge)
            except RateLimited:
                await self.teams.record(who.team, Tally(rate_limited=1))
                raise

    async def refund(self, responses: int) -> None:
        if self.teams.quota is not None:
            await self.teams.quota.refund(self.who, responses)

    async def score(
        self, scorer: Scorer, req: ScoreRequest, key: str | None, path: str, raw: bytes
    ) -> JSONBody:
        """``POST /v1/score``: idempotency, admission, scoring, records."""
        label = req.recipe if isinstance(req.recipe, str) else "inline"
        recipe = scorer.book.get(req.recipe)  # 422 for an unknown recipe, before any claim
        claim: Claim | None = None
        idem = self.teams.idempotency
        if key is not None and idem is not None:
            found = await idem.begin(self.who.team, check_key(key), "POST", path, raw)
            if isinstance(found, Replay):
                replayed = Tally(idempotent_replays=1)
                task = BackgroundTask(self.teams.record, self.who.team, replayed)
                return JSONBody(found.body, headers={REPLAYED: "true"}, background=task)
            claim = found
        responses = sum(len(g.responses) for g in req.groups)
        admitted = False
        try:
            await self.admit(recipe, label, responses)
            admitted = True
            scored = await scorer.score(req, self.team)
        except BaseException:
            await asyncio.shield(self._undo(claim, responses if admitted else 0))
            raise
        if claim is not None and idem is not None:
            # Stored and counted before the answer leaves (both at once): a retry after a
            # dropped connection finds it, and it is counted exactly once. New scores go to
            # the cache afterwards, as on every request.
            await asyncio.gather(idem.finish(claim, scored.body), self.teams.after(scored))
            store = BackgroundTask(scorer.store, scored.writes) if scored.writes else None
            return JSONBody(scored.body, background=store)
        return JSONBody(scored.body, background=BackgroundTask(scorer.finish, scored))

    async def _undo(self, claim: Claim | None, responses: int) -> None:
        if claim is not None and self.teams.idempotency is not None:
            await self.teams.idempotency.release(claim)
        if responses:
            await self.refund(responses)


async def current_tenant(request: Request) -> Tenant:
    """Dependency: the request's caller (``AuthMiddleware``) and the app's ``Teams``."""
    return Tenant(principal(request), request.app.state.teams)
