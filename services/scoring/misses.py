"""Step 3: what the cache did not have, as component calls.

Per component and group, the responses still unscored are de-duplicated (the same text
twice in a group is sent once and fills both indices); a group-level component (diversity)
is sent the whole group or nothing. Groups are packed into calls of at most
``batch_groups`` groups and ``batch_responses`` texts. Each call's body is serialised here
with ``json`` from plain lists: no pydantic model per request on the hot path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from arbiter.proto.components import ScoreGroup
from arbiter.services.scoring.plan import ComponentScores, Item
from arbiter.services.scoring.recipes import ComponentSpec


@dataclass(frozen=True)
class Call:
    """One request to a component service: the groups it carries and its JSON body."""

    comp: ComponentScores
    items: list[Item]
    body: bytes

    @property
    def spec(self) -> ComponentSpec:
        return self.comp.bound.spec


def misses(comp: ComponentScores, groups: list[ScoreGroup]) -> list[Item]:
    """The work ``comp`` still needs, one item per group that has any."""
    items = []
    for g, group in enumerate(groups):
        scores, keys, n = comp.scores[g], comp.keys[g], len(group.responses)
        if comp.group_level:
            if scores[0] is None:  # a cached group result fills every index
                items.append(Item(g, keys, [[j] for j in range(n)], group.responses, True))
            continue
        todo: dict[str, list[int]] = {}
        for j in range(n):
            if scores[j] is None:
                todo.setdefault(keys[j], []).append(j)
        if todo:
            positions = list(todo.values())
            texts = [group.responses[p[0]] for p in positions]
            full = len(positions) == n  # no hits, no duplicates: indices are as given
            items.append(Item(g, list(todo), positions, texts, full))
    return items


def chunks(items: list[Item], max_groups: int, max_responses: int) -> list[list[Item]]:
    """Consecutive runs of items, each within both limits (an item is never split)."""
    out: list[list[Item]] = []
    current: list[Item] = []
    size = 0
    for item in items:
        n = len(item.texts)
        if current and (len(current) >= max_groups or size + n > max_responses):
            out.append(current)
            current, size = [], 0
        current.append(item)
        size += n
    if current:
        out.append(current)
    return out


def call(comp: ComponentScores, chunk: list[Item], groups: list[ScoreGroup]) -> Call:
    """The ``ComponentRequest`` for ``chunk``, serialised."""
    payload = {
        "groups": [_group(groups[it.g], it.texts) for it in chunk],
        "params": comp.bound.params,
    }
    return Call(comp, chunk, json.dumps(payload, separators=(",", ":")).encode())


def _group(group: ScoreGroup, texts: list[str]) -> dict[str, object]:
    out: dict[str, object] = {
        "id": group.id,
        "prompt": group.prompt,
        "reference": group.reference,
        "responses": texts,
    }
    if group.metadata is not None:  # only when given: no null field for components to skip
        out["metadata"] = group.metadata
    return out
