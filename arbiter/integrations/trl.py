"""TRL reward functions that score through Arbiter's gateway.

    from arbiter.integrations.trl import ArbiterReward, recipe_rewards

    # One function for the recipe's weighted total; logs every component (log_metric).
    trainer = GRPOTrainer(..., reward_funcs=[ArbiterReward(recipe="gsm8k")])

    # One function per component: TRL logs rewards/<component>/mean, reward_weights apply.
    funcs, weights = recipe_rewards("gsm8k")
    trainer = GRPOTrainer(..., reward_funcs=funcs, args=GRPOConfig(reward_weights=weights))

    # By name (`trl grpo --reward_funcs arbiter.integrations.trl.math_accuracy`), with
    # ARBITER_URL, ARBITER_API_KEY, ARBITER_RECIPE, ARBITER_REFERENCE_COLUMN from the env.

TRL calls every reward function as ``f(prompts=, completions=, completion_ids=, **columns,
trainer_state=, log_extra=, log_metric=)`` (trl/trainer/grpo_trainer.py,
``GRPOTrainer._calculate_rewards``), each prompt repeated ``num_generations`` times in a
row. ``ArbiterReward`` regroups that flat batch into Arbiter groups, so group-level
components (diversity) see whole groups; with several processes (``torch.distributed``
initialised) it first gathers every rank's slice (``all_gather_object``), so a group split
across ranks is still scored whole. Component functions of one batch share one gateway
call (an in-process memo keyed by the request).

A masked score comes back as ``None``, which TRL turns into NaN: with Arbiter's functions
alone, a completion with every function NaN is left out of its group's baseline. **Mixed
with another reward function, TRL sums the functions with ``nansum``, so our ``None``
counts as 0 for that completion** — use Arbiter's functions alone (or put the other
reward into an Arbiter recipe) where that matters. A warning says so once per process and
kind of null, with the first reason.

A recipe the gateway cannot serve (a component whose service it has not configured, e.g.
``gsm8k-dj`` without a judge) stops the run at once: ``recipe_rewards`` checks it when it
asks for the recipe, and the gateway refuses the first scoring call of an ``ArbiterReward``
before any work (``arbiter.errors.NotConfigured``, 422, never retried); the message says
what is missing and how to add it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from arbiter.client import ArbiterClient, RecipeArg, score_body
from arbiter.errors import NotConfigured
from arbiter.integrations.breakdown import breakdown
from arbiter.integrations.text import first_reason
from arbiter.integrations.trl_batch import gather, rows, spans
from arbiter.proto.gateway import ScoreError, ScoreResponse

__all__ = [
    "ArbiterReward",
    "AsyncArbiterReward",
    "diversity",
    "format",
    "judge_quality",
    "judge_verifier",
    "math_accuracy",
    "recipe_rewards",
    "total",
    "trl_reward",
]

log = logging.getLogger("arbiter.integrations.trl")

# Keyword arguments TRL passes beside the dataset's columns (grpo_trainer.py, _calculate_rewards).
TRL_KWARGS = frozenset(
    {"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)
DEFAULT_REFERENCE_COLUMN = "answer"

_MEMO: OrderedDict[str, ScoreResponse] = OrderedDict()
_MEMO_SIZE = 8
_LOCK = threading.Lock()
_warned_kinds: set[str] = set()  # null kinds already warned about (once per process each)


# -- TRL's batch → Arbiter groups: Row, rows, spans, gather (trl_batch.py) ----------------
@dataclass
class Plan:
    """What to send for this rank's slice, and how to read this rank's values back."""

    body: dict[str, Any]
    key: str
    groups: list[tuple[int, int]]  # span of each sent group in the gathered batch
    local: tuple[int, int]  # this rank's slice of the gathered batch


# -- the reward function -------------------------------------------------------------------
class ArbiterReward:
    """A TRL reward function: a recipe's weighted total, or one component of it.

    Args:
        component: the component to return (``"math_accuracy"``…); None = the recipe total.
        recipe: a named recipe, an inline one, or None for ``$ARBITER_RECIPE``; a component
            function with neither scores that component alone (default params).
        base_url, api_key: the gateway; default ``$ARBITER_URL`` / ``$ARBITER_API_KEY``.
        reference_column: the dataset column holding the reference (``""``/None: none);
            a column TRL did not pass raises, naming it.
        reference_from_env: read the column from ``$ARBITER_REFERENCE_COLUMN`` at call
            time, ``reference_column`` being the default (the ready-made functions do).
        num_generations: TRL's ``num_generations``; given, groups are cut at that size even
            when two neighbouring prompts are equal.
        client: an ``ArbiterClient`` to use (retries and timeouts are its); pickling the
            function pickles it without its connection pools.
        name: the name TRL logs it under (default: the component, or ``arbiter_<recipe>``).
    """

    def __init__(
        self,
        component: str | None = None,
        recipe: RecipeArg | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        reference_column: str | None = DEFAULT_REFERENCE_COLUMN,
        num_generations: int | None = None,
        client: ArbiterClient | None = None,
        name: str | None = None,
        reference_from_env: bool = False,
    ) -> None:
        self.component = component
        self.recipe = recipe
        self.reference_column = reference_column
        self.reference_from_env = reference_from_env
        self.num_generations = num_generations
        self.base_url = base_url
        self.api_key = api_key
        self._client = client
        self._name = name

    @property
    def __name__(self) -> str:  # TRL names the function's metrics after it
        if self._name:
            return self._name
        if self.component:
            return self.component
        recipe = self._recipe()
        label = recipe if isinstance(recipe, str) else "inline"
        return f"arbiter_{label}".replace("-", "_")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(component={self.component!r}, recipe={self.recipe!r})"

    @property
    def client(self) -> ArbiterClient:
        if self._client is None:
            self._client = ArbiterClient(self.base_url, api_key=self.api_key)
            log.info("%s: rewards from the gateway at %s", self.__name__, self._client.base_url)
        return self._client

    def _recipe(self) -> RecipeArg | None:
        return self.recipe if self.recipe is not None else os.environ.get("ARBITER_RECIPE") or None

    def _column(self) -> str | None:
        if self.reference_from_env:
            return os.environ.get("ARBITER_REFERENCE_COLUMN", self.reference_column or "") or None
        return self.reference_column or None

    def _resolved_recipe(self) -> RecipeArg:
        recipe = self._recipe()
        if recipe is not None:
            return recipe
        if self.component is None:
            raise ValueError(
                "ArbiterReward: no recipe; pass recipe='gsm8k' (or an inline recipe) or set "
                "ARBITER_RECIPE"
            )
        return {"name": self.component, "components": [{"name": self.component}]}

    def plan(
        self, prompts: Sequence[Any], completions: Sequence[Any], kwargs: dict[str, Any]
    ) -> Plan:
        """The request for this rank's slice (after gathering every rank's rows)."""
        column = self._column()
        refs = None
        if column is not None:
            if column not in kwargs:
                columns = sorted(k for k in kwargs if k not in TRL_KWARGS)
                raise KeyError(
                    f"reference_column {column!r} is not a column of the dataset; TRL passed "
                    f"{columns}. Pass reference_column='<column>' (or set "
                    f"ARBITER_REFERENCE_COLUMN), or reference_column=None to score without one."
                )
            refs = kwargs[column]
        local = rows(prompts, completions, refs)
        batch, offset = gather(local)
        lo, hi = offset, offset + len(local)
        # Score only the groups that touch this rank's slice (a group split across two
        # ranks is sent by both, whole, and scores the same on each).
        groups = [(a, b) for a, b in spans(batch, self.num_generations) if a < hi and b > lo]
        wire = [
            {"id": str(a), "prompt": batch[a].prompt, "reference": batch[a].reference,
             "responses": [r.response for r in batch[a:b]]}
            for a, b in groups
        ]  # fmt: skip
        body = score_body(wire, self._resolved_recipe())
        blob = json.dumps([self.client.base_url, body], sort_keys=True).encode()
        return Plan(body, hashlib.sha256(blob).hexdigest(), groups, (lo, hi))

    def values(self, plan: Plan, out: ScoreResponse, kwargs: dict[str, Any]) -> list[float | None]:
        """This rank's values, in TRL's order; logs components when TRL gave log_metric."""
        lo, hi = plan.local
        per_row: dict[str, list[float | None]] = {}
        for (a, b), group in zip(plan.groups, out.groups, strict=True):
            series = {"__total__": group.rewards, **group.components, **breakdown(group)}
            for name, scores in series.items():
                column = per_row.setdefault(name, [])
                column.extend(scores[i - a] for i in range(max(a, lo), min(b, hi)))
        if self.component is None:
            result = per_row["__total__"]
            self._log(per_row, kwargs)
        elif self.component in per_row:
            result = per_row[self.component]
        else:
            have = sorted(k for k in per_row if k != "__total__")
            raise ValueError(
                f"component {self.component!r} is not in recipe {out.recipe.name!r} "
                f"(it has {have}); pick one of those or another recipe"
            )
        if len(result) != hi - lo:
            raise RuntimeError(f"got {len(result)} rewards for {hi - lo} completions")
        if any(r is None for r in result):
            _warn_nulls(result, _errors(plan, out, self.component))
        return result

    def _log(self, per_row: dict[str, list[float | None]], kwargs: dict[str, Any]) -> None:
        log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
        for name, scores in per_row.items():
            if name == "__total__":
                continue
            present = [s for s in scores if s is not None]
            if callable(log_metric) and present:
                log_metric(f"arbiter/{name}/mean", sum(present) / len(present))
            if callable(log_extra):
                log_extra(f"arbiter/{name}", scores)
        totals = per_row["__total__"]
        if callable(log_metric) and totals:
            log_metric("arbiter/masked_frac", sum(t is None for t in totals) / len(totals))

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        plan = self.plan(prompts, completions, kwargs)
        out = _memo_get(plan.key)
        if out is None:
            out = self.client.score(plan.body["groups"], plan.body["recipe"])
            _memo_put(plan.key, out)
        return self.values(plan, out, kwargs)


class AsyncArbiterReward(ArbiterReward):
    """The same, as a coroutine: TRL runs async reward functions concurrently on its own
    event loop (``asyncio.gather``), so several of them overlap their gateway calls."""

    async def __call__(  # type: ignore[override]
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        plan = self.plan(prompts, completions, kwargs)
        out = _memo_get(plan.key)
        if out is None:
            out = await self.client.ascore(plan.body["groups"], plan.body["recipe"])
            _memo_put(plan.key, out)
        return self.values(plan, out, kwargs)


def _memo_get(key: str) -> ScoreResponse | None:
    with _LOCK:
        out = _MEMO.get(key)
        if out is not None:
            _MEMO.move_to_end(key)
        return out


def _memo_put(key: str, out: ScoreResponse) -> None:
    with _LOCK:
        _MEMO[key] = out
        while len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)


def _errors(plan: Plan, out: ScoreResponse, component: str | None) -> list[ScoreError]:
    """The error entries of this rank's completions (of ``component`` when given)."""
    lo, hi = plan.local
    return [
        e
        for (a, _), group in zip(plan.groups, out.groups, strict=True)
        for e in group.errors
        if lo <= a + e.index < hi and (component is None or e.component == component)
    ]


def _warn_nulls(result: list[float | None], errors: list[ScoreError]) -> None:
    """Once per process and kind: how many are None, the kind and its first reason."""
    reason = first_reason(errors, _warned_kinds)
    if reason is None:
        return
    kind, why = reason
    log.warning(
        "Arbiter returned None (could not score) for %d of %d completions, kind %r (%s; "
        "retryable kinds are timeout and unavailable). TRL ignores a completion only when "
        "every reward function gives None; mixed with another reward function, TRL's "
        "nansum counts this None as 0 for it.",
        sum(r is None for r in result),
        len(result),
        kind,
        why[:500],
    )


def recipe_rewards(
    recipe: str, client: ArbiterClient | None = None, **kwargs: Any
) -> tuple[list[ArbiterReward], list[float]]:
    """One reward function per component of a named recipe, and the recipe's weights
    (for ``GRPOConfig(reward_weights=…)``); the gateway is asked for the recipe once, and
    ``NotConfigured`` (with the reason and how to fix it) is raised here when it cannot
    serve it."""
    if client is None:
        client = ArbiterClient(kwargs.pop("base_url", None), api_key=kwargs.pop("api_key", None))
    found = {r.name: r for r in client.recipes()}
    if recipe not in found:
        raise ValueError(f"recipe {recipe!r} is not on the gateway; it has {sorted(found)}")
    if not found[recipe].available:  # e.g. gsm8k-dj on a gateway without a judge
        raise NotConfigured(found[recipe].reason or f"recipe {recipe!r} is not available")
    comps = found[recipe].components
    funcs = [ArbiterReward(c.name, recipe, client=client, **kwargs) for c in comps]
    return funcs, [c.weight for c in comps]


def trl_reward(
    recipe: RecipeArg = "gsm8k",
    base_url: str | None = None,
    reference_column: str | None = DEFAULT_REFERENCE_COLUMN,
    client: ArbiterClient | None = None,
) -> ArbiterReward:
    """The recipe-total reward function (the name earlier releases exported)."""
    return ArbiterReward(recipe=recipe, base_url=base_url, reference_column=reference_column,
                         client=client)  # fmt: skip


# Importable by name: URL, key, recipe and reference column come from the environment at
# call time (ARBITER_URL, ARBITER_API_KEY, ARBITER_RECIPE, ARBITER_REFERENCE_COLUMN).
total = ArbiterReward(reference_from_env=True)
math_accuracy = ArbiterReward("math_accuracy", reference_from_env=True)
format = ArbiterReward("format", reference_from_env=True)  # the component's name
judge_quality = ArbiterReward("judge_quality", reference_from_env=True)
judge_verifier = ArbiterReward("judge_verifier", reference_from_env=True)
diversity = ArbiterReward("diversity", reference_from_env=True)
