"""Embedding routes: parse, call the handler on ``app.state``, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from proto.components import ComponentResponse
from proto.embedding import DiversityRequest, EmbeddingRequest, EmbeddingResponse, ModelList
from services.embedding.scoring import EmbeddingHandler

router = APIRouter(prefix="/v1", tags=["embedding"])


def get_handler(request: Request) -> EmbeddingHandler:
    handler: EmbeddingHandler = request.app.state.embedding
    return handler


HandlerDep = Annotated[EmbeddingHandler, Depends(get_handler)]


@router.post("/diversity", response_model=ComponentResponse, summary="diversity per response")
async def diversity(req: DiversityRequest, handler: HandlerDep) -> ComponentResponse:
    """1 − cos(e_i, mean of the group's normalised embeddings); null + `empty_response`
    for an empty response, null + `group_too_small` when < 2 non-empty responses;
    `info.truncated` lists responses cut to the model's max sequence length."""
    return await handler.diversity(req)


@router.post("/embeddings", response_model=EmbeddingResponse, summary="OpenAI-compatible")
async def embeddings(req: EmbeddingRequest, handler: HandlerDep) -> EmbeddingResponse:
    """OpenAI's embeddings API: L2-normalised vectors, `float` or `base64` encoding."""
    return await handler.embeddings(req)


@router.get("/models", response_model=ModelList, summary="the served model")
async def models(handler: HandlerDep) -> ModelList:
    return handler.models()
