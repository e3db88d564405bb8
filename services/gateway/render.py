"""The last step of ``/v1/score``: the ``ScoreResponse`` body of a ``Scored``, made once.

The body is built as plain dicts and lists and serialised with ``json``: it has the
``ScoreResponse`` shape (the route documents that model, ``tests/services/gateway`` parse
bodies with it) without building one per request. Error entries come sorted per
component (weighted-sum failures first, under component ``reward``).
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import Counter

from arbiter.services.scoring.scoring import Scored

REWARD = "reward"  # the error entry's component when the weighted sum itself failed

COMPONENT_ERRORS = Counter(
    "arbiter_gateway_component_errors_total", "Null scores by component and kind.",
    ["component", "kind"],
)  # fmt: skip


def group_errors(scored: Scored, g: int) -> list[dict[str, Any]]:
    """Group ``g``'s error entries: the rewards' own, then each component's by index."""
    out = [
        {"component": REWARD, "index": j, "kind": kind, "message": message}
        for j, kind, message in scored.reward_errors[g]
    ]
    for c in scored.comps:
        for j, kind, message in sorted(c.errors[g]):
            out.append({"component": c.name, "index": j, "kind": kind, "message": message})
    return out


def render(scored: Scored) -> bytes:
    out_groups = []
    label = {c.name: c.bound.spec.metric_label for c in scored.comps}  # a grader's: "grader"
    for g, group in enumerate(scored.groups):
        rewards = scored.rewards[g]
        errors = group_errors(scored, g)
        for e in errors:
            COMPONENT_ERRORS.labels(label.get(e["component"], e["component"]), e["kind"]).inc()
        out_groups.append(
            {
                "id": group.id,
                "rewards": rewards,
                "components": {c.name: c.scores[g] for c in scored.comps},
                "masked": [r is None for r in rewards],
                "errors": errors,
                "info": {c.name: c.info[g] for c in scored.comps if c.info[g]},
            }
        )
    usage = {**scored.totals(), "elapsed_ms": round(scored.elapsed_s * 1000, 3)}
    doc = {"recipe": scored.recipe.ref_json, "groups": out_groups, "usage": usage}
    return json.dumps(doc, separators=(",", ":")).encode()
