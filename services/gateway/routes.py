"""Gateway routes: parse, call the scorer built at start-up, return its rendered body.

Every ``/v1/*`` route is behind ``AuthMiddleware`` (401); the scoring work goes through
the caller's ``Tenant`` (403, quotas, idempotency, usage: ``teams.py``).
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request

from arbiter.errors import Unprocessable
from arbiter.proto.errors import ErrorResponse
from arbiter.proto.gateway import RecipeList, ScoreRequest, ScoreResponse
from arbiter.proto.usage import UsageReport
from arbiter.services.common.responses import JSONBody
from arbiter.services.gateway.idempotency import HEADER
from arbiter.services.gateway.scoring import Scorer
from arbiter.services.gateway.teams import Tenant, current_tenant
from arbiter.services.gateway.usage import today

# The answers of an authenticated route, besides every service's (ERROR_RESPONSES).
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 403)
}

router = APIRouter(tags=["score"], responses=AUTH_RESPONSES)


async def _scorer(request: Request) -> Scorer:
    scorer: Scorer = request.app.state.scorer
    return scorer


ScorerDep = Annotated[Scorer, Depends(_scorer)]
TenantDep = Annotated[Tenant, Depends(current_tenant)]
_IDEMPOTENCY = Header(
    alias=HEADER,
    description="Any unique string (a UUID) per scoring call, the same on its retries: a "
    "retry gets the stored answer and is counted once (24 h).",
)


@router.post(
    "/v1/score",
    response_model=ScoreResponse,
    summary="Score rollout groups with a named or inline recipe",
    responses={409: {"model": ErrorResponse}},
)
async def score(
    body: ScoreRequest,
    request: Request,
    scorer: ScorerDep,
    tenant: TenantDep,
    idempotency_key: Annotated[str | None, _IDEMPOTENCY] = None,
) -> JSONBody:
    raw = await request.body() if idempotency_key is not None else b""  # already read: cached
    return await tenant.score(scorer, body, idempotency_key, request.url.path, raw)


@router.get(
    "/v1/recipes", response_model=RecipeList, summary="The named recipes the caller may use"
)
async def recipes(scorer: ScorerDep, tenant: TenantDep) -> JSONBody:
    allowed = [r for r in scorer.book.refs() if tenant.who.may_use_recipe(r.name)]
    return JSONBody(RecipeList(recipes=allowed))


@router.get(
    "/v1/usage",
    response_model=UsageReport,
    tags=["usage"],
    summary="The caller's team's usage per UTC day (an admin key: every team's)",
)
async def usage(
    tenant: TenantDep,
    start: Annotated[date | None, Query(alias="from", description="First UTC day (today).")] = None,
    end: Annotated[date | None, Query(alias="to", description="Last UTC day (`from`).")] = None,
    team: Annotated[str | None, Query(max_length=64, description="Admin: one team.")] = None,
) -> JSONBody:
    start = start or today()
    end = end or start
    if end < start:
        raise Unprocessable("to: is before from", param="to", code="invalid_range")
    report = await tenant.teams.usage(tenant.who, start, end, team)
    return JSONBody(report)
