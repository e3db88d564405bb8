"""Gateway routes: parse, call the scorer built at start-up, return its rendered body."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.background import BackgroundTask

from arbiter.proto.gateway import RecipeList, ScoreRequest, ScoreResponse
from arbiter.services.common.responses import JSONBody
from arbiter.services.gateway.scoring import Scorer

router = APIRouter(tags=["score"])


async def _scorer(request: Request) -> Scorer:
    scorer: Scorer = request.app.state.scorer
    return scorer


ScorerDep = Annotated[Scorer, Depends(_scorer)]


@router.post(
    "/v1/score",
    response_model=ScoreResponse,
    summary="Score rollout groups with a named or inline recipe",
)
async def score(body: ScoreRequest, scorer: ScorerDep) -> JSONBody:
    scored = await scorer.score(body)
    # New scores go to the cache after the response is sent: one Redis round trip less
    # on the caller's critical path.
    store = BackgroundTask(scorer.store, scored.writes) if scored.writes else None
    return JSONBody(scored.body, background=store)


@router.get("/v1/recipes", response_model=RecipeList, summary="The named recipes")
async def recipes(scorer: ScorerDep) -> JSONBody:
    return JSONBody(RecipeList(recipes=scorer.book.refs()))
