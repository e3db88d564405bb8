"""Embedding routes: parse, call the handler on ``app.state``, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from arbiter.proto.components import ComponentResponse
from arbiter.proto.embedding import DiversityRequest, EmbeddingRequest, EmbeddingResponse, ModelList
from arbiter.services.common.fairness import TeamDep
from arbiter.services.common.responses import JSONBody
from arbiter.services.embedding.scoring import EmbeddingHandler

router = APIRouter(prefix="/v1", tags=["embedding"])


async def get_handler(request: Request) -> EmbeddingHandler:
    # async: a plain `def` dependency would run on the threadpool, one thread hop per request
    handler: EmbeddingHandler = request.app.state.embedding
    return handler


HandlerDep = Annotated[EmbeddingHandler, Depends(get_handler)]


@router.post("/diversity", response_model=ComponentResponse, summary="diversity per response")
async def diversity(req: DiversityRequest, handler: HandlerDep, team: TeamDep) -> JSONBody:
    """1 − cos(e_i, mean of the group's normalised embeddings); null + `empty_response`
    for an empty response, null + `group_too_small` when < 2 non-empty responses;
    `info.truncated` lists responses cut to the model's max sequence length."""
    return JSONBody(await handler.diversity(req, team))


@router.post("/embeddings", response_model=EmbeddingResponse, summary="OpenAI-compatible")
async def embeddings(req: EmbeddingRequest, handler: HandlerDep, team: TeamDep) -> JSONBody:
    """OpenAI's embeddings API: L2-normalised vectors, `float` or `base64` encoding."""
    return JSONBody(await handler.embeddings(req, team))


@router.get("/models", response_model=ModelList, summary="the served model")
async def models(handler: HandlerDep) -> JSONBody:
    return JSONBody(handler.models())
