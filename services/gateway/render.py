"""Step 5: the ``ScoreResponse`` body from the filled plan.

Rewards are the weighted sums, null when any weighted component of that response is null
(a zero-weight component never nulls a reward) or when the sum is not finite (an error
entry with component ``reward`` says so): the body is always strict JSON. The body is
built as plain dicts and lists and serialised with ``json``: it has the ``ScoreResponse``
shape (the route documents that model, ``tests/services/gateway`` parse bodies with it)
without building one per request.
"""

from __future__ import annotations

import json
import math

from prometheus_client import Counter

from arbiter.proto.components import ScoreGroup
from arbiter.services.gateway.merge import Merged
from arbiter.services.gateway.plan import ComponentScores
from arbiter.services.gateway.recipes import ResolvedRecipe
from arbiter.services.gateway.reward_metrics import SCORES

REWARD = "reward"  # the error entry's component when the weighted sum itself failed

COMPONENT_ERRORS = Counter(
    "arbiter_gateway_component_errors_total", "Null scores by component and kind.",
    ["component", "kind"],
)  # fmt: skip


def render(
    recipe: ResolvedRecipe,
    groups: list[ScoreGroup],
    comps: list[ComponentScores],
    merged: Merged,
    elapsed_s: float,
) -> bytes:
    weighted = [(c, c.bound.weight) for c in comps if c.bound.weight != 0]
    out_groups = []
    responses = 0
    for g, group in enumerate(groups):
        n = len(group.responses)
        responses += n
        rewards: list[float | None] = []
        errors = []
        for j in range(n):
            total: float | None = 0.0
            for c, w in weighted:
                s = c.scores[g][j]
                if s is None:
                    total = None
                    break
                total += w * s  # type: ignore[operator]
            if total is not None and not math.isfinite(total):
                # Bounded weights times finite scores cannot overflow, but a component may
                # answer a finite score far outside its range: null it, never send inf.
                errors.append({"component": REWARD, "index": j, "kind": "bad_response",
                               "message": f"the weighted sum is not finite ({total})"})  # fmt: skip
                total = None
            rewards.append(total)
        SCORES.observe_rewards(recipe.ref.name, rewards)
        info = {}
        for c in comps:
            SCORES.observe_component(c.name, c.scores[g])
            for j, kind, message in sorted(c.errors[g]):
                COMPONENT_ERRORS.labels(c.name, kind).inc()
                errors.append({"component": c.name, "index": j, "kind": kind, "message": message})
            if c.info[g]:
                info[c.name] = c.info[g]
        out_groups.append(
            {
                "id": group.id,
                "rewards": rewards,
                "components": {c.name: c.scores[g] for c in comps},
                "masked": [r is None for r in rewards],
                "errors": errors,
                "info": info,
            }
        )
    hits = sum(c.hits for c in comps)
    usage = {
        "responses": responses,
        "cache_hits": hits,
        "cache_misses": responses * len(comps) - hits,
        "judge_prompt_tokens": merged.prompt_tokens,
        "judge_completion_tokens": merged.completion_tokens,
        "elapsed_ms": round(elapsed_s * 1000, 3),
    }
    doc = {"recipe": recipe.ref_json, "groups": out_groups, "usage": usage}
    return json.dumps(doc, separators=(",", ":")).encode()
