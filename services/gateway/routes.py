"""Gateway routes: parse, then the scoring call's lifecycle (``lifecycle.py``): admit,
score and settle, answer the bytes rendered once.

Every ``/v1/*`` route is behind ``AuthMiddleware`` (401), which puts the caller's
``Principal`` on the request.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request

from arbiter.errors import Unprocessable
from arbiter.keys import Principal
from arbiter.proto.errors import ErrorResponse
from arbiter.proto.gateway import RecipeInfo, RecipeList, ScoreRequest, ScoreResponse
from arbiter.proto.graders import (
    GraderRunRequest,
    GraderRunResponse,
    GraderValidateRequest,
    GraderValidateResponse,
)
from arbiter.proto.usage import UsageReport
from arbiter.services.common.responses import JSONBody
from arbiter.services.gateway import grader_api
from arbiter.services.gateway.auth import principal
from arbiter.services.gateway.idempotency import HEADER
from arbiter.services.gateway.lifecycle import IdempotentCall, Lifecycle
from arbiter.services.gateway.usage import today
from arbiter.services.scoring.fanout import not_configured
from arbiter.services.scoring.recipes import COMPONENTS

# The answers of an authenticated route, besides every service's (ERROR_RESPONSES).
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 403)
}

router = APIRouter(tags=["score"], responses=AUTH_RESPONSES)


async def _lifecycle(request: Request) -> Lifecycle:
    lifecycle: Lifecycle = request.app.state.lifecycle
    return lifecycle


async def _caller(request: Request) -> Principal:
    return principal(request)


LifecycleDep = Annotated[Lifecycle, Depends(_lifecycle)]
CallerDep = Annotated[Principal, Depends(_caller)]
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
    lifecycle: LifecycleDep,
    who: CallerDep,
    idempotency_key: Annotated[str | None, _IDEMPOTENCY] = None,
) -> JSONBody:
    idempotent = None
    if idempotency_key is not None:  # the body was read already: cached
        idempotent = IdempotentCall(idempotency_key, "POST", request.url.path, await request.body())
    responses = sum(len(g.responses) for g in body.groups)
    ticket = await lifecycle.admit(who, body.recipe, responses, idempotent=idempotent)
    if isinstance(ticket, JSONBody):  # the stored answer of an earlier call with the key
        return ticket
    return JSONBody(await lifecycle.score(ticket, body.groups, body.on_error == "fail"))


@router.get(
    "/v1/recipes",
    response_model=RecipeList,
    summary="The named recipes the caller may use, each available here or not (and why)",
)
async def recipes(lifecycle: LifecycleDep, who: CallerDep) -> JSONBody:
    listed = []
    for r in lifecycle.book.named():
        if who.may_use_recipe(r.ref.name):
            why = lifecycle.unavailable(r)
            info = {**r.ref_json, "available": why is None, "reason": why}
            listed.append(RecipeInfo.model_validate(info))
    client = lifecycle.scorer.client
    unconfigured = {s.name: not_configured(s).message for s in client.missing(COMPONENTS.values())}
    return JSONBody(RecipeList(recipes=listed, unconfigured=unconfigured))


@router.get(
    "/v1/usage",
    response_model=UsageReport,
    tags=["usage"],
    summary="The caller's team's usage per UTC day (an admin key: every team's)",
)
async def usage(
    lifecycle: LifecycleDep,
    who: CallerDep,
    start: Annotated[date | None, Query(alias="from", description="First UTC day (today).")] = None,
    end: Annotated[date | None, Query(alias="to", description="Last UTC day (`from`).")] = None,
    team: Annotated[str | None, Query(max_length=64, description="Admin: one team.")] = None,
) -> JSONBody:
    start = start or today()
    end = end or start
    if end < start:
        raise Unprocessable("to: is before from", param="to", code="invalid_range")
    report = await lifecycle.teams.usage(who, start, end, team)
    return JSONBody(report)


@router.post(
    "/v1/fine_tuning/alpha/graders/run",
    response_model=GraderRunResponse,
    tags=["graders"],
    summary="OpenAI's graders API: grade one model sample with a grader",
)
async def run_grader(body: GraderRunRequest, lifecycle: LifecycleDep, who: CallerDep) -> JSONBody:
    return JSONBody(await grader_api.run(lifecycle, who, body))


@router.post(
    "/v1/fine_tuning/alpha/graders/validate",
    response_model=GraderValidateResponse,
    tags=["graders"],
    summary="OpenAI's graders API: check a grader (422 naming the field if it is wrong)",
)
async def validate_grader(body: GraderValidateRequest, who: CallerDep) -> JSONBody:
    return JSONBody(grader_api.validate(body))
