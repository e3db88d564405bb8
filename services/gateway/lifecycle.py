"""One lifecycle for every scoring call: ``/v1/score`` and each compat route alike.

1. **Admission** (``Lifecycle.admit``), before any work. The body was read within its
   deadline and its team's body budget (``services/common/limits.py``) and the caller
   authenticated (``auth.py``). Then, in this order: the recipe is resolved, once (422);
   the team's allow-lists (403); every component's service is configured here (else 422
   ``component_not_configured``, naming what is missing and how to add it: a deployment's
   choice is refused, never retried, and costs no quota); the ``Idempotency-Key`` is
   claimed, or the stored answer replayed (the allow-lists were checked first, so a
   replay re-checks the key's current access); the quota takes the request's responses
   (429/413; the claim is released). The result is a ``Ticket``: who, the recipe, the
   ``Scope`` the work runs in.
2. **Scoring**: ``Scorer.score(recipe, groups, scope)`` (pure, ``services/scoring/``), directly
   for ``/v1/score``, through the group collector for the compat routes.
3. **Settlement** (``Lifecycle.settle``), exactly once per ticket, whatever happened
   (an answer, an error, the client leaving: it runs shielded from the cancellation):

   1. idempotency: the answer's bytes stored under the key, or the key released;
   2. ledger: the answered request's counters, or ``unanswered`` and the responses
      charged for it;
   3. quota: the judge tokens used are charged; a request not answered gets back the
      responses whose work never reached a component (charge what was started);
   4. cache: the new scores are handed to the cache (written beside the answer, not
      before it: nothing above depends on them).

4. **Render**: the bytes, made once (``render.py`` for ``/v1/score``; the compat routes
   build their framework's shape). ``/v1/score`` renders before settling, because
   settlement stores those very bytes for the ``Idempotency-Key``.

``settling`` wraps steps 2 to 4 so that every exit goes through ``settle``.
"""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from starlette.background import BackgroundTask

from arbiter.errors import ArbiterError, Forbidden, NotConfigured, RateLimited, Timeout, Unavailable
from arbiter.keys import Principal
from arbiter.proto.components import ScoreGroup
from arbiter.proto.gateway import Recipe
from arbiter.services.common.responses import JSONBody
from arbiter.services.gateway.idempotency import REPLAYED, Claim, Replay, check_key
from arbiter.services.gateway.render import render
from arbiter.services.gateway.teams import Teams
from arbiter.services.gateway.usage import tally
from arbiter.services.scoring.fanout import missing_text
from arbiter.services.scoring.grading import needed
from arbiter.services.scoring.recipes import RecipeBook, ResolvedRecipe
from arbiter.services.scoring.scoring import THREAD_RESPONSES, Scope, Scored, Scorer


@dataclass(frozen=True)
class IdempotentCall:
    """An ``Idempotency-Key`` and what it must match on a retry."""

    key: str
    method: str
    path: str
    body: bytes


@dataclass
class Ticket:
    """An admitted scoring call: settled exactly once."""

    who: Principal
    recipe: ResolvedRecipe
    responses: int
    scope: Scope
    ledger: str | None  # the team whose ledger it goes to (None: auth off)
    taken: int = 0  # responses taken from the quota
    claim: Claim | None = None
    settled: bool = False


@dataclass
class Settlement:
    """What the scoring step leaves for settle; ``answer`` once the caller has its scores."""

    answered: bool = False
    body: bytes | None = None
    counts: Tally[str] | None = None
    judge_tokens: int = 0
    writes: list[tuple[str, str]] = field(default_factory=list)

    def scored(self, scored: Scored) -> None:
        """The work is done (answered or not): its judge tokens and new scores settle."""
        self.judge_tokens = scored.merged.prompt_tokens + scored.merged.completion_tokens
        self.writes = scored.writes

    def answer(self, counts: Tally[str], body: bytes | None = None) -> None:
        self.answered, self.counts, self.body = True, counts, body


class Lifecycle:
    """Built once at start-up (``app.state.lifecycle``)."""

    def __init__(
        self,
        book: RecipeBook,
        scorer: Scorer,
        teams: Teams,
        weights: Mapping[str, int] | None = None,
    ):
        self.book = book
        self.scorer = scorer
        self.teams = teams
        self.weights = dict(weights or {})  # GATEWAY_TEAM_WEIGHTS: fair-share weights
        self._stores: set[asyncio.Task[None]] = set()

    async def admit(
        self,
        who: Principal,
        recipe: str | Recipe,
        responses: int,
        *,
        param: str = "groups",
        idempotent: IdempotentCall | None = None,
    ) -> Ticket | JSONBody:
        """A ``Ticket``, or the stored answer of an ``Idempotency-Key`` (a replay)."""
        resolved = self.book.get(recipe)  # 422 for an unknown recipe or bad params
        label = recipe if isinstance(recipe, str) else "inline"
        _check_allowed(who, resolved, label)
        why = self.unavailable(resolved)
        if why is not None:  # a deployment's choice, not a fault: 422, never retried
            raise NotConfigured(why, param="recipe")
        claim: Claim | None = None
        idem = self.teams.idempotency
        if idempotent is not None and idem is not None:
            i = idempotent
            found = await idem.begin(who.team, check_key(i.key), i.method, i.path, i.body)
            if isinstance(found, Replay):
                task = BackgroundTask(self.teams.record, self._ledger(who), _REPLAYED)
                return JSONBody(found.body, headers={REPLAYED: "true"}, background=task)
            claim = found
        try:
            taken = await self._take(who, resolved, responses, param)
        except BaseException:
            if claim is not None and idem is not None:
                await asyncio.shield(idem.release(claim))
            raise
        shared = resolved.ref.cache == "shared" or not self.teams.auth
        weight = self.weights.get(who.team, 1)
        scope = Scope(who.team, None if shared else who.team, weight=weight)
        return Ticket(who, resolved, responses, scope, self._ledger(who), taken, claim)

    def unavailable(self, recipe: ResolvedRecipe) -> str | None:
        """Why this gateway cannot serve ``recipe`` (a component's service has no URL), or
        None. The refusal's message and ``GET /v1/recipes``' ``reason`` alike."""
        missing = self.scorer.client.missing(needed(recipe))
        if not missing:
            return None
        name = repr(recipe.ref.name) if recipe.named else "(inline)"
        return f"recipe {name} {missing_text(missing)}"

    def _ledger(self, who: Principal) -> str | None:
        return who.team if self.teams.auth else None

    async def _take(self, who: Principal, recipe: ResolvedRecipe, n: int, param: str) -> int:
        if self.teams.quota is None:
            return 0
        uses_judge = any(spec.service == "judge" for spec in needed(recipe))
        try:
            return await self.teams.quota.take(who, n, uses_judge, param)
        except RateLimited:
            await self.teams.record(self._ledger(who), Tally(rate_limited=1))
            raise

    @asynccontextmanager
    async def settling(self, ticket: Ticket) -> AsyncIterator[Settlement]:
        """Steps 2-4 inside; ``settle`` on every way out (shielded from cancellation)."""
        done = Settlement()
        try:
            yield done
        except BaseException:
            done.answered = False
            await asyncio.shield(self.settle(ticket, done))
            raise
        await asyncio.shield(self.settle(ticket, done))

    async def settle(self, ticket: Ticket, done: Settlement) -> None:
        """Idempotency, ledger, quota, cache: in that order, once (the module docstring)."""
        if ticket.settled:
            return
        ticket.settled = True
        idem = self.teams.idempotency
        if ticket.claim is not None and idem is not None:
            if done.answered and done.body is not None:
                await idem.finish(ticket.claim, done.body)
            else:
                await idem.release(ticket.claim)
        started = min(ticket.scope.progress.count, ticket.responses)
        if done.answered and done.counts is not None:
            await self.teams.record(ticket.ledger, done.counts)
        elif not done.answered:
            await self.teams.record(
                ticket.ledger, Tally(unanswered=1, unanswered_responses=started)
            )
        await self.teams.charge_judge(ticket.who.team, done.judge_tokens)
        if not done.answered:
            await self.teams.refund(ticket.who, ticket.taken - min(started, ticket.taken))
        if done.writes:
            self.scorer.remember(done.writes)
            task = asyncio.get_running_loop().create_task(self.scorer.store(done.writes))
            self._stores.add(task)
            task.add_done_callback(self._stores.discard)

    async def score(self, ticket: Ticket, groups: list[ScoreGroup], fail_on_error: bool) -> bytes:
        """``/v1/score``'s scoring, settlement and bytes."""
        async with self.settling(ticket) as done:
            scored = await self.scorer.score(ticket.recipe, groups, ticket.scope)
            done.scored(scored)
            if scored.failures and fail_on_error:
                raise failure_error(scored.failures)
            big = ticket.responses >= THREAD_RESPONSES
            body = await asyncio.to_thread(render, scored) if big else render(scored)
            done.answer(tally(scored), body)
        return body

    async def close(self) -> None:
        """Wait for the cache writes still running (shutdown)."""
        if self._stores:
            await asyncio.gather(*self._stores, return_exceptions=True)


_REPLAYED = Tally(idempotent_replays=1)


def failure_error(failures: list[ArbiterError]) -> ArbiterError:
    """The request-level error for ``on_error="fail"``: 504 when every failure timed out."""
    messages = "; ".join(dict.fromkeys(f.message for f in failures))[:1000]
    if all(f.kind == "timeout" for f in failures):
        return Timeout(messages, code="component_timeout")
    return Unavailable(messages, code=f"component_{failures[0].kind}")


def _check_allowed(who: Principal, recipe: ResolvedRecipe, label: str) -> None:
    """The team's allow-lists (403); ``label`` is the recipe's name, or ``inline``."""
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
