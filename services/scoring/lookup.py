"""Step 2: fill the plan from the cache, every component's keys in one round trip.

A response-level entry is the score itself (``repr(float)``), or ``{"s": score, "i": notes}``
with the response's share of the group's info (``merge.join_notes`` puts it back); a
group-level entry is ``{"s": scores, "i": info}`` for the whole ordered group. An entry
that cannot be read, or a group entry of the wrong length, counts as a miss. ``pending``
holds this process's writes that the background store has not yet handed to Redis, so a
request always sees the scores of the one just answered.
"""

from __future__ import annotations

import json

from prometheus_client import Counter

from arbiter.proto.components import ScoreGroup
from arbiter.services.scoring.cache import Cache, Value
from arbiter.services.scoring.plan import ComponentScores

# Keys per cache round trip: one MGET for a usual request; a maximal one (1,024 x 256
# responses, two components) in 32, so packing half a million keys never holds the loop.
CHUNK_KEYS = 16_384

CACHE_LOOKUPS = Counter(
    "arbiter_gateway_cache_total",
    "Component scores looked up in the cache.",
    ["component", "result"],
)


async def lookup(
    cache: Cache, pending: dict[str, str], comps: list[ComponentScores], groups: list[ScoreGroup]
) -> None:
    """Fill cached scores of ``comps`` in place: one ``get_many`` (Redis MGET) per
    ``CHUNK_KEYS`` keys."""
    flat = [k for c in comps for keys in c.keys for k in keys]
    values: list[Value | None] = []
    for i in range(0, len(flat), CHUNK_KEYS):  # a maximal request: the loop runs between
        values.extend(await cache.get_many(flat[i : i + CHUNK_KEYS]))
    if pending:
        values = [pending.get(k) if v is None else v for k, v in zip(flat, values, strict=True)]
    pos = 0
    total = sum(len(g.responses) for g in groups)
    for comp in comps:
        for g, keys in enumerate(comp.keys):
            for j in range(len(keys)):
                value = values[pos]
                pos += 1
                if value is not None:
                    _fill_hit(comp, g, j, value, len(groups[g].responses))
        CACHE_LOOKUPS.labels(comp.name, "hit").inc(comp.hits)
        CACHE_LOOKUPS.labels(comp.name, "miss").inc(total - comp.hits)


def _fill_hit(comp: ComponentScores, g: int, j: int, value: Value, n: int) -> None:
    try:
        if comp.group_level:
            doc = json.loads(value)
            scores = doc["s"]
            if len(scores) != n or any(s is None for s in scores):
                return
            comp.scores[g] = [float(s) for s in scores]
            comp.info[g] = doc.get("i") or {}
            comp.hits += n
            comp.hit_at.update((g, i) for i in range(n))
        else:
            text = value.decode() if isinstance(value, bytes) else value
            if text.startswith("{"):  # a score with its notes on this response
                doc = json.loads(text)
                comp.scores[g][j] = float(doc["s"])
                if isinstance(doc.get("i"), dict) and doc["i"]:
                    comp.notes[(g, j)] = doc["i"]
            else:  # a bare score
                comp.scores[g][j] = float(text)
            comp.hits += 1
            comp.hit_at.add((g, j))
    except (ValueError, KeyError, TypeError):
        return  # an unreadable entry is a miss
