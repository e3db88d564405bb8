"""Step 1 of a score request: the plan, one result table per recipe component.

Every component gets a slot per response (``scores[g][j]``, ``None`` until filled), its
errors and notes per group, and the cache keys of its work. The later steps fill these
tables in place: the cache lookup (``lookup.py``), the component calls for what is still
missing (``misses.py``, ``merge.py``); the gateway's ``render.py`` reads them into the response.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arbiter.proto.components import ScoreGroup
from arbiter.services.scoring.cache import cache_keys
from arbiter.services.scoring.recipes import BoundComponent, ResolvedRecipe


@dataclass
class Item:
    """What one group contributes to a component call."""

    g: int  # the group's index in the request
    keys: list[str]  # response-level: one per text sent; group-level: the group's key
    positions: list[list[int]]  # per text sent: the response indices it stands for
    texts: list[str]
    full: bool  # the component sees the whole group, in order


@dataclass
class ComponentScores:
    """One component's results for every group of the request."""

    bound: BoundComponent
    scores: list[list[float | None]]  # (groups, responses)
    errors: list[list[tuple[int, str, str]]]  # per group: (index, kind, message)
    info: list[dict[str, Any]]  # per group: the component's notes
    keys: list[list[str]]  # per group: its cache keys (one per response, or one per group)
    hits: int = 0  # scores filled from the cache
    hit_at: set[tuple[int, int]] = field(default_factory=set)  # their (group, index)
    # a response-level component's notes on one response (its share of the group's lists),
    # from the cache or the call: joined into ``info`` when some came from the cache
    notes: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.bound.spec.name

    @property
    def group_level(self) -> bool:
        return self.bound.spec.granularity == "group"

    def fail(self, item: Item, kind: str, message: str) -> None:
        """Null every response the item stands for, with the reason."""
        for pos in item.positions:
            for j in pos:
                self.scores[item.g][j] = None
                self.errors[item.g].append((j, kind, message))


def plan(
    recipe: ResolvedRecipe, groups: list[ScoreGroup], team: str | None = None
) -> list[ComponentScores]:
    """Empty result tables, with cache keys (in ``team``'s cache space, or the shared one
    when None), for every component of the recipe."""
    return [
        ComponentScores(
            bound=b,
            scores=[[None] * len(g.responses) for g in groups],
            errors=[[] for _ in groups],
            info=[{} for _ in groups],
            keys=[cache_keys(b, g, team) for g in groups],
        )
        for b in recipe.components
    ]
