"""Arbiter's batch routes beside ORS's one-call routes: ``/v1/envs/batch/create``,
``/call`` and ``/delete`` carry many episodes' calls in one request (``envs_batch.py``; the
models are ``proto.envs``'s ``Batch*``). A trainer stepping hundreds of episodes at once
makes a few requests a turn this way, not one per episode. They need an API key and run
as its team, as the ORS session routes do; each item answers what its ORS route would.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from starlette.responses import Response

from arbiter.proto.envs import (
    BatchCall,
    BatchCalled,
    BatchCreate,
    BatchCreated,
    BatchDelete,
    BatchDeleted,
)
from arbiter.services.gateway.auth import principal
from arbiter.services.gateway.envs_batch import EnvsBatches
from arbiter.services.gateway.idempotency import HEADER
from arbiter.services.gateway.ors import KEYED_ERRORS
from arbiter.services.gateway.routes import AUTH_RESPONSES

router = APIRouter(
    prefix="/v1/envs/batch",
    tags=["environments (batch)"],
    responses={**AUTH_RESPONSES, **KEYED_ERRORS},
)
IdempotencyDep = Annotated[
    str | None,
    Header(alias=HEADER, description="Any unique string per batch, the same on its retries."),
]


async def get_batches(request: Request) -> EnvsBatches:
    state = request.app.state
    if getattr(state, "envs_batches", None) is None:
        state.envs_batches = EnvsBatches(state.envs)
    batches: EnvsBatches = state.envs_batches
    return batches


BatchesDep = Annotated[EnvsBatches, Depends(get_batches)]


@router.post("/create", response_model=BatchCreated, summary="Open many episodes")
async def create(
    req: BatchCreate, request: Request, batches: BatchesDep, key: IdempotencyDep = None
) -> Response:
    body = await request.body()
    return await batches.forward(principal(request), "create", body, len(req.episodes), key)


@router.post("/call", response_model=BatchCalled, summary="Tool calls on many episodes")
async def call(
    req: BatchCall, request: Request, batches: BatchesDep, key: IdempotencyDep = None
) -> Response:
    body = await request.body()
    return await batches.forward(principal(request), "call", body, len(req.calls), key)


@router.post("/delete", response_model=BatchDeleted, summary="End many episodes")
async def delete(
    req: BatchDelete, request: Request, batches: BatchesDep, key: IdempotencyDep = None
) -> Response:
    body = await request.body()
    return await batches.forward(principal(request), "delete", body, len(req.sids), key)
