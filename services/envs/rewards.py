"""Rewards and sandbox runs through the scoring core the gateway uses too, never a second one.

A submit is scored as ``/v1/score`` scores a response: a recipe resolved by
``scoring.recipes``, planned, fanned out to the component services by
``scoring.fanout.ComponentClient`` (with the team header, in the team's fair share of the
slots), merged and weighed by ``scoring.scoring.Scorer``. The environments' runs of code
(``run``, ``run_tests``) are ``code_tests`` calls on the same path. The client is built from
the envs service's own settings (``component_settings``), not the gateway's.

What came back decides the outcome (``Judged``): a component that failed for a reason that
is not the policy's (the sandbox unreachable or overloaded, a timeout under load) raises
that error, retryable (503/504), so the client calls again; a reward the components could
not compute for any other reason is ``None`` with its kind and message, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arbiter.errors import ArbiterError, Timeout, Unavailable
from arbiter.proto.components import ScoreGroup
from arbiter.proto.errors import RETRYABLE_KINDS
from arbiter.services.envs.settings import EnvsSettings
from arbiter.services.scoring.cache import NullCache
from arbiter.services.scoring.fanout import ComponentClient
from arbiter.services.scoring.recipes import RecipeBook, ResolvedRecipe
from arbiter.services.scoring.scoring import Scope, Scored, Scorer
from arbiter.services.scoring.settings import ComponentSettings


@dataclass
class Judged:
    """One response scored: its reward (None: not computed, with why) and the breakdown."""

    reward: float | None
    components: dict[str, float | None]
    errors: list[dict[str, str]]
    info: dict[str, Any]  # per component: its notes on this response
    cpu_ms: int = 0
    recipe: dict[str, Any] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "components": self.components,
            "errors": self.errors,
        }


def component_settings(settings: EnvsSettings) -> ComponentSettings:
    """What the scoring core reads, from the envs service's own settings (``ENVS_*``):
    verify and the sandbox, each call within ``ENVS_COMPONENT_TIMEOUT_S``; slots and batch
    sizes at the core's defaults."""
    urls = {"verify": settings.verify_url, "sandbox": settings.sandbox_url}
    return ComponentSettings(
        service_urls={service: url for service, url in urls.items() if url is not None},
        component_timeout_s=settings.component_timeout_s,
    )


class Rewards:
    """Built once at start-up (``app.state.rewards``): one ComponentClient, no cache (an
    episode's submit is scored once)."""

    def __init__(self, settings: EnvsSettings):
        self.settings = settings
        self.client = ComponentClient(component_settings(settings))
        self.scorer = Scorer(NullCache(), self.client)
        self.book = RecipeBook()

    async def close(self) -> None:
        await self.client.close()

    def recipe(self, name: str) -> ResolvedRecipe:
        return self.book.get(name)

    async def score(self, recipe: ResolvedRecipe, group: ScoreGroup, team: str) -> Judged:
        """The one response of ``group`` scored by ``recipe`` for ``team``."""
        scored = await self.scorer.score(recipe, [group], Scope(team=team))
        return judged(scored)


def judged(scored: Scored) -> Judged:
    components: dict[str, float | None] = {}
    errors: list[dict[str, str]] = []
    info: dict[str, Any] = {}
    for comp in scored.comps:
        components[comp.name] = comp.scores[0][0]
        # a response-level component's notes are lists, one entry per response: ours is one
        notes = comp.info[0] if comp.info else {}
        info[comp.name] = {k: v[0] if isinstance(v, list) and len(v) == 1 else v
                           for k, v in notes.items()}  # fmt: skip
        for _, kind, message in comp.errors[0]:
            if kind in RETRYABLE_KINDS:
                raise retryable(kind, f"{comp.name}: {message}")
            errors.append({"component": comp.name, "kind": kind, "message": message})
    for _, kind, message in scored.reward_errors[0]:
        errors.append({"component": "", "kind": kind, "message": message})
    return Judged(
        reward=scored.rewards[0][0],
        components=components,
        errors=errors,
        info=info,
        cpu_ms=scored.totals()["sandbox_cpu_ms"],
        recipe={"name": scored.recipe.ref.name, "fingerprint": scored.recipe.ref.fingerprint},
    )


def retryable(kind: str, message: str) -> ArbiterError:
    """A failure that is not the policy's: the client may call again."""
    if kind == "timeout":
        return Timeout(message)
    return Unavailable(message)
