"""The work behind ``POST /v1/score``: look up the cache, fan out the misses, combine.

Per request: every component's cache keys are looked up in one ``get_many`` (one Redis
MGET); what is missing is sent, de-duplicated within each group, in chunks of groups, to
all components concurrently; results are written back to exactly the response indices
they came from; successful scores are cached; rewards are the weighted sums. The response
is serialised here with ``json`` from plain lists (no per-request pydantic models).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client import Counter

from arbiter.proto.gateway import ScoreGroup, ScoreRequest
from arbiter.services.common.app import NON_BLOCKING_PREFIXES
from arbiter.services.common.errors import Unavailable, Unprocessable, UpstreamTimeout
from arbiter.services.gateway.cache import Cache, cache_keys
from arbiter.services.gateway.fanout import CallFailure, CallResult, ComponentClient, env_var
from arbiter.services.gateway.recipes import BoundComponent, RecipeBook, ResolvedRecipe

REQUESTS = Counter(
    "arbiter_gateway_score_requests_total", "POST /v1/score by recipe and outcome.",
    ["recipe", "outcome"],
)  # fmt: skip
CACHE_LOOKUPS = Counter(
    "arbiter_gateway_cache_total",
    "Component scores looked up in the cache.",
    ["component", "result"],
)
COMPONENT_ERRORS = Counter(
    "arbiter_gateway_component_errors_total", "Null scores by component and kind.",
    ["component", "kind"],
)  # fmt: skip

MAX_PENDING = 200_000


@dataclass
class _Item:
    """What one group contributes to a component call."""

    g: int
    keys: list[str]  # response-level: one per text sent; group-level: the group's key
    positions: list[list[int]]  # per text sent: the response indices it stands for
    texts: list[str]
    full: bool  # the component sees the whole group, in order


@dataclass
class _Component:
    """One component's results for every group of the request."""

    bound: BoundComponent
    scores: list[list[float | None]]
    errors: list[list[tuple[int, str, str]]]
    info: list[dict[str, Any]]
    keys: list[list[str]] = field(default_factory=list)
    hits: int = 0

    def fail(self, item: _Item, kind: str, message: str) -> None:
        for pos in item.positions:
            for j in pos:
                self.scores[item.g][j] = None
                self.errors[item.g].append((j, kind, message))


class Scored(NamedTuple):
    body: bytes  # the serialised ScoreResponse
    writes: list[tuple[str, str]]  # new cache entries, to store once the body is sent


class Scorer:
    """Built once at start-up (app.state.scorer); one call per ``/v1/score`` request."""

    def __init__(self, book: RecipeBook, cache: Cache, client: ComponentClient, enabled: bool):
        self.book = book
        self.cache = cache
        self.client = client
        self.cache_enabled = enabled
        self.batch_groups = client.settings.batch_groups
        self.batch_responses = client.settings.batch_responses
        self._pending: dict[str, str] = {}

    async def score(self, req: ScoreRequest) -> Scored:
        label = req.recipe if isinstance(req.recipe, str) else "inline"
        try:
            scored = await self._score(req)
        except Unprocessable:
            REQUESTS.labels(label if label in self.book.names else "unknown", "invalid").inc()
            raise
        except (Unavailable, UpstreamTimeout):
            REQUESTS.labels(label, "failed").inc()
            raise
        REQUESTS.labels(label, "ok").inc()
        return scored

    async def store(self, writes: list[tuple[str, str]]) -> None:
        """Write new scores to the cache; runs after the response has been sent."""
        try:
            await self.cache.set_many(writes)
        finally:
            for key, value in writes:
                if self._pending.get(key) == value:
                    del self._pending[key]

    async def _score(self, req: ScoreRequest) -> Scored:
        start = time.perf_counter()
        recipe = self.book.get(req.recipe)
        groups = req.groups
        comps = [
            _Component(
                bound=b,
                scores=[[None] * len(g.responses) for g in groups],
                errors=[[] for _ in groups],
                info=[{} for _ in groups],
            )
            for b in recipe.components
        ]
        await self._lookup(comps, groups)
        calls: list[tuple[_Component, list[_Item]]] = []
        failures: list[CallFailure] = []
        for comp in comps:
            items = self._misses(comp, groups)
            if self.client.url(comp.bound.spec) is None:
                failures.append(CallFailure("unavailable", _unconfigured(comp)))
                for item in items:
                    comp.fail(item, "unavailable", failures[-1].message)
                continue
            calls.extend((comp, chunk) for chunk in self._chunks(items))
        results = await asyncio.gather(*(self._call(c, chunk, groups) for c, chunk in calls))
        writes: list[tuple[str, str]] = []
        tokens = [0, 0]
        for (comp, chunk), result in zip(calls, results, strict=True):
            if isinstance(result, CallFailure):
                if result.kind == "bad_params":
                    ci = comps.index(comp)
                    param = f"recipe.components.{ci}.{result.param}"
                    raise Unprocessable(
                        f"{param}: {result.message}", param=param, code="invalid_params"
                    )
                failures.append(result)
                for item in chunk:
                    comp.fail(item, result.kind, result.message)
                continue
            if comp.bound.spec.service == "judge":  # embedding reports tokens too; not billed
                tokens[0] += result.usage.prompt_tokens
                tokens[1] += result.usage.completion_tokens
            _merge(comp, chunk, result, writes)
        if not self.cache_enabled:
            writes = []
        if failures and req.on_error == "fail":
            await self.store(writes)
            raise _failure_error(failures)
        # Written after the response is sent (the route's background task). Until Redis has
        # them they are served from ``_pending``, so this process always sees its own writes.
        if len(self._pending) > MAX_PENDING:  # only if background writes never ran
            self._pending.clear()
        self._pending.update(writes)
        body = _render(recipe, groups, comps, tokens, time.perf_counter() - start)
        return Scored(body, writes)

    async def _lookup(self, comps: list[_Component], groups: list[ScoreGroup]) -> None:
        """Fill cached scores for every component with one cache round trip."""
        for comp in comps:
            comp.keys = [cache_keys(comp.bound, g) for g in groups]
        if not self.cache_enabled:
            return
        live = [c for c in comps if self.client.url(c.bound.spec) is not None]
        flat = [k for c in live for keys in c.keys for k in keys]
        values = await self.cache.get_many(flat)
        if self._pending:
            pending = self._pending
            values = [pending.get(k) if v is None else v for k, v in zip(flat, values, strict=True)]
        pos = 0
        for comp in live:
            for g, keys in enumerate(comp.keys):
                for j, _ in enumerate(keys):
                    value = values[pos]
                    pos += 1
                    if value is not None:
                        _fill_hit(comp, g, j, value, len(groups[g].responses))
            name = comp.bound.spec.name
            total = sum(len(g.responses) for g in groups)
            CACHE_LOOKUPS.labels(name, "hit").inc(comp.hits)
            CACHE_LOOKUPS.labels(name, "miss").inc(total - comp.hits)

    def _misses(self, comp: _Component, groups: list[ScoreGroup]) -> list[_Item]:
        items = []
        group_level = comp.bound.spec.granularity == "group"
        for g, group in enumerate(groups):
            scores, keys, n = comp.scores[g], comp.keys[g], len(group.responses)
            if group_level:
                if scores[0] is None:  # a cached group result fills every index
                    items.append(_Item(g, keys, [[j] for j in range(n)], group.responses, True))
                continue
            todo: dict[str, list[int]] = {}
            for j in range(n):
                if scores[j] is None:
                    todo.setdefault(keys[j], []).append(j)
            if todo:
                positions = list(todo.values())
                texts = [group.responses[p[0]] for p in positions]
                full = len(positions) == n  # no hits, no duplicates: indices are as given
                items.append(_Item(g, list(todo), positions, texts, full))
        return items

    def _chunks(self, items: list[_Item]) -> list[list[_Item]]:
        chunks: list[list[_Item]] = []
        current: list[_Item] = []
        size = 0
        for item in items:
            n = len(item.texts)
            if current and (len(current) >= self.batch_groups or size + n > self.batch_responses):
                chunks.append(current)
                current, size = [], 0
            current.append(item)
            size += n
        if current:
            chunks.append(current)
        return chunks

    async def _call(
        self, comp: _Component, chunk: list[_Item], groups: list[ScoreGroup]
    ) -> CallResult:
        payload = {
            "groups": [
                {
                    "id": groups[it.g].id,
                    "prompt": groups[it.g].prompt,
                    "reference": groups[it.g].reference,
                    "responses": it.texts,
                }
                for it in chunk
            ],
            "params": comp.bound.params,
        }
        body = json.dumps(payload, separators=(",", ":")).encode()
        return await self.client.call(comp.bound.spec, body)

    async def ready(self) -> dict[str, str]:
        services = ("verify", "embedding", "judge")
        overrides = self.client.settings.component_urls
        checks = await asyncio.gather(
            *(self.client.ready(s) for s in services),
            *(self.client.ready_url(url) for url in overrides.values()),
            self.cache.check(),
        )
        names = [*services, *(f"{name} (GATEWAY_COMPONENT_URLS)" for name in overrides), "cache"]
        # A component that is down degrades the gateway (its scores come back null + masked)
        # but does not take it out of service: math and format keep flowing while vLLM restarts.
        return {
            name: check if check == "ok" or check.startswith(NON_BLOCKING_PREFIXES)
            else f"degraded: {check}"
            for name, check in zip(names, checks, strict=True)
        }  # fmt: skip


def _unconfigured(comp: _Component) -> str:
    spec = comp.bound.spec
    return (
        f"component {spec.name!r} needs the {spec.service} service, which is not configured: "
        f"set {env_var(spec.service)}"
    )


def _fill_hit(comp: _Component, g: int, j: int, value: str | bytes, n: int) -> None:
    try:
        if comp.bound.spec.granularity == "group":
            doc = json.loads(value)
            scores = doc["s"]
            if len(scores) != n or any(s is None for s in scores):
                return
            comp.scores[g] = [float(s) for s in scores]
            comp.info[g] = doc.get("i") or {}
            comp.hits += n
        else:
            comp.scores[g][j] = float(value)
            comp.hits += 1
    except (ValueError, KeyError, TypeError):
        return  # an unreadable entry is a miss


def _merge(comp: _Component, chunk: list[_Item], resp: Any, writes: list[tuple[str, str]]) -> None:
    name = comp.bound.spec.name
    if len(resp.groups) != len(chunk):
        for item in chunk:
            comp.fail(item, "bad_response", f"{name}: {len(resp.groups)} groups for {len(chunk)}")
        return
    group_level = comp.bound.spec.granularity == "group"
    for item, rg in zip(chunk, resp.groups, strict=True):
        if len(rg.scores) != len(item.texts):
            msg = f"{name}: {len(rg.scores)} scores for {len(item.texts)} responses"
            comp.fail(item, "bad_response", msg)
            continue
        explained: set[int] = set()
        for err in rg.errors:
            if err.index < len(item.positions):
                explained.add(err.index)
                for j in item.positions[err.index]:
                    comp.errors[item.g].append((j, err.kind, err.message))
        all_ok = True
        for u, score in enumerate(rg.scores):
            if score is not None and not math.isfinite(score):
                score = None
                explained.discard(u)
            if score is None:
                all_ok = False
                if u not in explained:
                    for j in item.positions[u]:
                        comp.errors[item.g].append((j, "bad_response", f"{name}: null, no reason"))
            elif not group_level:
                writes.append((item.keys[u], repr(score)))
            for j in item.positions[u]:
                comp.scores[item.g][j] = score
        info = rg.info
        if info and not item.full:
            info = {**info, "sent_indices": [p[0] for p in item.positions]}
        if info:
            comp.info[item.g] = info
        if group_level and all_ok:
            writes.append((item.keys[0], json.dumps({"s": rg.scores, "i": rg.info})))


def _failure_error(failures: list[CallFailure]) -> Exception:
    messages = "; ".join(dict.fromkeys(f.message for f in failures))[:1000]
    if all(f.kind == "timeout" for f in failures):
        return UpstreamTimeout(messages, code="component_timeout")
    return Unavailable(messages, code=f"component_{failures[0].kind}")


def _render(
    recipe: ResolvedRecipe,
    groups: list[ScoreGroup],
    comps: list[_Component],
    tokens: list[int],
    elapsed: float,
) -> bytes:
    weighted = [(c, c.bound.weight) for c in comps if c.bound.weight != 0]
    out_groups = []
    hits = responses = 0
    for g, group in enumerate(groups):
        n = len(group.responses)
        responses += n
        rewards: list[float | None] = []
        for j in range(n):
            total: float | None = 0.0
            for c, w in weighted:
                s = c.scores[g][j]
                if s is None:
                    total = None
                    break
                total += w * s  # type: ignore[operator]
            rewards.append(total)
        errors = []
        info = {}
        for c in comps:
            name = c.bound.spec.name
            for j, kind, message in sorted(c.errors[g]):
                COMPONENT_ERRORS.labels(name, kind).inc()
                errors.append({"component": name, "index": j, "kind": kind, "message": message})
            if c.info[g]:
                info[name] = c.info[g]
        out_groups.append(
            {
                "id": group.id,
                "rewards": rewards,
                "components": {c.bound.spec.name: c.scores[g] for c in comps},
                "masked": [r is None for r in rewards],
                "errors": errors,
                "info": info,
            }
        )
    hits = sum(c.hits for c in comps)
    total_scores = responses * len(comps)
    usage = {
        "responses": responses,
        "cache_hits": hits,
        "cache_misses": total_scores - hits,
        "judge_prompt_tokens": tokens[0],
        "judge_completion_tokens": tokens[1],
        "elapsed_ms": round(elapsed * 1000, 3),
    }
    doc = {"recipe": recipe.ref_json, "groups": out_groups, "usage": usage}
    return json.dumps(doc, separators=(",", ":")).encode()
