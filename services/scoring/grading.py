"""OpenAI graders as recipe components: graded in process by the scoring core (in the
gateway, or the envs service), reaching the services a grader needs through the same
``ComponentClient`` as every component call.

Why here and not in a service of their own: a grader is a composition (a ``multi`` mixes
a pure check, a sandboxed program and a judge call), and the scoring core is what already
holds every service's client, its slots and the caller's fair share. The pure graders
(``string_check``, ``text_similarity`` but ``cosine``) cost microseconds per response: a
hop to verify would cost more than the check (large batches leave the event loop for a
worker thread, ``engine.THREAD_ROWS``). ``cosine`` calls the embedding service's
``/v1/embeddings``, ``python`` the sandbox's ``python_grader``, model graders the judge's
``/v1/model_grader``, each in the calling team's share of that service's slots.

``LocalGraders.call`` speaks the component protocol (a ``ComponentRequest`` body in, a
``ComponentResponse`` out), so plan, cache, merge and render treat a grader like any
component: its scores are cached per response, keyed by the grader's JSON.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import aiohttp

from arbiter.errors import ArbiterError, Timeout, Unavailable, Unprocessable, from_response
from arbiter.keys import ANONYMOUS
from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.components import ComponentGroupResult, ComponentResponse, ComponentUsage
from arbiter.proto.errors import ItemError
from arbiter.proto.graders import LabelModelGrader, PythonGrader, ScoreModelGrader
from arbiter.services.graders import spec as grader_spec
from arbiter.services.graders.engine import Outcome, Row, grade
from arbiter.services.graders.templating import MissingVariable, resolve, variables
from arbiter.services.sandbox import grader as openai_shapes
from arbiter.services.scoring.fanout import CallResult, ComponentClient
from arbiter.services.scoring.recipes import COMPONENTS, ComponentSpec, ResolvedRecipe

GRADERS = "graders"  # the service of a grader component: graded in this process
ModelGrader = ScoreModelGrader | LabelModelGrader
# The pseudo-component each service a grader reaches is called as (slots, timeouts, logs).
COSINE = ComponentSpec("text_similarity", "embedding", "/v1/embeddings", "response", object)  # type: ignore[arg-type]
MODEL_GRADER = ComponentSpec("model_grader", "judge", "/v1/model_grader", "response", object)  # type: ignore[arg-type]


def needed(recipe: ResolvedRecipe) -> list[ComponentSpec]:
    """The specs whose services ``recipe`` reaches: a built-in component's own, and for a
    grader each service it calls (named by the grader's component name)."""
    out = []
    for b in recipe.components:
        if b.spec.service != GRADERS:
            out.append(b.spec)
            continue
        for service in sorted(grader_spec.uses(b.spec.grader)):
            path = {"sandbox": "/v1/python_grader", "embedding": COSINE.path}.get(service, "")
            out.append(ComponentSpec(b.spec.name, service, path, "response", object))  # type: ignore[arg-type]
    return out


def check_items(grader: Any, items: list[dict[str, Any]]) -> None:
    """MissingVariable for the first ``{{ item.* }}`` of ``grader`` an item lacks."""
    wanted = [
        v for t in grader_spec.templates(grader) for v in variables(t) if v.startswith("item")
    ]
    for item in items if wanted else []:
        for variable in wanted:
            resolve(variable, {}, item)


def row_item(group: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``item`` for a group: as ``python_grader`` builds it (the metadata's keys,
    ``prompt``, ``reference``, ``metadata``)."""
    return openai_shapes.item(group["prompt"], group["reference"], {}, group.get("metadata"))


class _Backend:
    """One call's services, in its team's share of their slots."""

    def __init__(
        self, graders: LocalGraders, groups: list[dict[str, Any]], team: str, request: Hashable,
        weight: int,
    ) -> None:  # fmt: skip
        self.graders = graders
        self.client = graders.client
        self.groups = groups
        self.team, self.request, self.weight = team, request, weight
        self.usage = ComponentUsage()

    async def python(self, grader: PythonGrader, rows: list[Row]) -> list[Outcome]:
        flags: dict[str, Any]  # OpenAI's error flags of a failed row
        by_group: dict[int, list[str]] = {}
        for row in rows:
            by_group.setdefault(row.group, []).append(row.sample["output_text"])
        groups = [{**self.groups[g], "responses": texts} for g, texts in by_group.items()]
        body = json.dumps({"groups": groups, "params": {"source": grader.source}}).encode()
        result = await self.client.call(
            COMPONENTS["python_grader"], body, self.team, self.request, None, self.weight
        )
        if isinstance(result, ArbiterError):
            flags = {
                "python_grader_server_error": True,
                "python_grader_server_error_type": result.kind,
            }
            return [Outcome.failed(result.kind, result.message, **flags) for _ in rows]
        self.usage.cpu_ms += result.usage.cpu_ms
        out = []
        for rg in result.groups:
            reasons = {e.index: e for e in rg.errors}
            for u, score in enumerate(rg.scores):
                err = reasons.get(u)
                if score is not None and err is None:
                    out.append(Outcome(score))
                elif err is not None and err.kind == "grader_error":
                    flags = {"python_grader_runtime_error": True,
                             "python_grader_runtime_error_details": err.message}  # fmt: skip
                    out.append(Outcome.failed("grader_error", err.message, **flags))
                else:
                    kind = err.kind if err else "bad_response"
                    message = err.message if err else "python_grader: null, no reason"
                    flags = {"python_grader_server_error": True,
                             "python_grader_server_error_type": str(kind)}  # fmt: skip
                    out.append(Outcome.failed(kind, message, **flags))
        if len(out) != len(rows):
            return [Outcome.failed("bad_response", "python_grader: wrong count") for _ in rows]
        return out

    async def embed_cosine(self, pairs: list[tuple[str, str]]) -> list[Outcome]:
        texts = sorted({t for pair in pairs for t in pair if t})
        vectors: dict[str, list[float]] = {}
        if texts:
            got = await self.graders.embed(texts, self.team, self.request, self.weight)
            if isinstance(got, ArbiterError):
                return [Outcome.failed(got.kind, got.message, other_error=True) for _ in pairs]
            vectors = dict(zip(texts, got, strict=True))
        out = []
        for a, b in pairs:
            if not a or not b:  # an empty text has no embedding: alike only if both are
                out.append(Outcome(float(a == b)))
                continue
            va, vb = vectors[a], vectors[b]
            dot = sum(x * y for x, y in zip(va, vb, strict=True))
            norm = math.sqrt(sum(x * x for x in va) * sum(y * y for y in vb)) or 1.0
            out.append(Outcome(max(-1.0, min(1.0, dot / norm))))
        return out

    async def model(
        self, grader: ModelGrader, messages: list[list[dict[str, str]]]
    ) -> list[Outcome]:
        params = grader.model_dump(mode="json", exclude_none=True)
        body = json.dumps({"params": params, "messages": messages}).encode()
        result = await self.graders.post_judge(body, self.team, self.request, self.weight)
        if isinstance(result, ArbiterError):
            flags = {"model_grader_server_error": True,
                     "model_grader_server_error_details": result.message}  # fmt: skip
            return [Outcome.failed(result.kind, result.message, **flags) for _ in messages]
        out = []
        for r in result["results"]:
            tokens = int(r.get("tokens", 0))
            self.usage.prompt_tokens += int(r.get("prompt_tokens", 0))
            self.usage.completion_tokens += int(r.get("completion_tokens", 0))
            if r.get("score") is None:
                flag = {"judge_parse_error": "model_grader_parse_error"}.get(
                    r.get("kind", ""), "model_grader_server_error"
                )
                outcome = Outcome.failed(
                    r.get("kind", "bad_response"), r.get("message", ""), **{flag: True}
                )
            else:
                outcome = Outcome(float(r["score"]))
            outcome.tokens = tokens
            out.append(outcome)
        if len(out) != len(messages):
            return [Outcome.failed("bad_response", "judge: wrong count") for _ in messages]
        return out


class LocalGraders:
    """The ``graders`` service, in process: a ``fanout.Caller``, as ``ComponentClient`` is."""

    def __init__(self, client: ComponentClient):
        self.client = client
        self._embedding_model: str | None = None

    async def call(
        self,
        spec: ComponentSpec,
        body: bytes,
        team: str = ANONYMOUS,
        request: Hashable = None,
        sent: Callable[[], None] | None = None,
        weight: int = 1,
    ) -> CallResult:
        grader = spec.grader  # validated when the recipe was resolved
        groups: list[dict[str, Any]] = json.loads(body)["groups"]
        rows = [
            Row(openai_shapes.sample(text), row_item(group), g)
            for g, group in enumerate(groups)
            for text in group["responses"]
        ]
        # Every item variable, before any work: a row without one is the caller's 422. The
        # groups are the scoring call's, so this is the one check of them on /v1/score.
        try:
            check_items(grader, [row.item for row in rows])
        except MissingVariable as exc:
            return Unprocessable(f"grader: {exc}", param="grader", code="invalid_variable")
        if sent is not None:
            sent()
        backend = _Backend(self, groups, team, request, weight)
        outcomes = await grade(grader, rows, backend)
        return _response(spec.name, groups, outcomes, backend.usage)

    async def embed(
        self, texts: list[str], team: str, request: Hashable, weight: int
    ) -> list[list[float]] | ArbiterError:
        """L2-normalised embeddings of ``texts`` from the embedding service."""
        model = await self._model(team, request, weight)
        if isinstance(model, ArbiterError):
            return model
        body = json.dumps({"input": texts, "model": model}).encode()
        got = await self._post(COSINE, body, team, request, weight)
        if isinstance(got, ArbiterError):
            return got
        return [d["embedding"] for d in sorted(got["data"], key=lambda d: d["index"])]

    async def post_judge(
        self, body: bytes, team: str, request: Hashable, weight: int
    ) -> dict[str, Any] | ArbiterError:
        return await self._post(MODEL_GRADER, body, team, request, weight)

    async def _model(self, team: str, request: Hashable, weight: int) -> str | ArbiterError:
        if self._embedding_model is None:
            got = await self._post(COSINE, None, team, request, weight, path="/v1/models")
            if isinstance(got, ArbiterError):
                return got
            self._embedding_model = str(got["data"][0]["id"])
        return self._embedding_model

    async def _post(
        self, spec: ComponentSpec, body: bytes | None, team: str, request: Hashable, weight: int,
        path: str | None = None,
    ) -> dict[str, Any] | ArbiterError:  # fmt: skip
        """A JSON call outside the component protocol, with ``ComponentClient``'s slots,
        deadline and failure kinds."""
        base = self.client.settings.service_url(spec.service)
        # Admission refuses a grader whose services have no URL here (``needed``).
        assert base is not None, f"{spec.name}: called without a {spec.service} URL"
        url = base + (path or spec.path)
        timeout = self.client.settings.timeout_for(spec.name)
        headers = {"content-type": "application/json", TEAM_HEADER: team}
        try:
            async with (
                asyncio.timeout(timeout),
                self.client.slots[spec.service].slot(team, request, weight),
            ):
                method = self.client.session.get if body is None else self.client.session.post
                async with method(url, data=body, headers=headers) as resp:
                    content = await resp.read()
                    if resp.status != 200:
                        return from_response(resp.status, content, source=spec.name)
                    parsed: dict[str, Any] = json.loads(content)
                    return parsed
        except TimeoutError:
            return Timeout(f"{spec.name}: no answer within {timeout:g}s")
        except (aiohttp.ClientError, ValueError) as exc:
            return Unavailable(f"{spec.name}: {spec.service} failed ({type(exc).__name__})")


def _response(
    name: str, groups: list[dict[str, Any]], outcomes: Iterable[Outcome], usage: ComponentUsage
) -> ComponentResponse:
    it = iter(outcomes)
    out = []
    for group in groups:
        n = len(group["responses"])
        mine = [next(it) for _ in range(n)]
        errors = [
            ItemError(index=u, kind=o.kind or "grader_error", message=o.message)
            for u, o in enumerate(mine)
            if o.score is None
        ]
        info: dict[str, Any] = {}
        if any(o.sub for o in mine):
            info["scores"] = [o.sub for o in mine]
        if any(o.flags for o in mine):
            info["errors"] = [o.flags for o in mine]
        if any(o.tokens for o in mine):
            info["token_usage"] = [o.tokens for o in mine]
        scores = [o.score for o in mine]
        out.append(ComponentGroupResult(id=group["id"], scores=scores, errors=errors, info=info))
    usage.items = sum(len(g["responses"]) for g in groups)
    return ComponentResponse(component=name, groups=out, usage=usage)
