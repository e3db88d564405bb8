"""Batch routes (``batch.py``): parse, call ``Batches``, return. Every one needs the team
header the gateway sets, as the session routes do."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from arbiter.proto.envs import (
    BatchCall,
    BatchCalled,
    BatchCreate,
    BatchCreated,
    BatchDelete,
    BatchDeleted,
)
from arbiter.services.common.responses import JSONBody
from arbiter.services.envs.batch import Batches
from arbiter.services.envs.routes import TeamDep

router = APIRouter(prefix="/v1/batch", tags=["envs batch"])


async def get_batches(request: Request) -> Batches:
    state = request.app.state
    if getattr(state, "batches", None) is None:
        state.batches = Batches(state.envs)
    batches: Batches = state.batches
    return batches


BatchesDep = Annotated[Batches, Depends(get_batches)]


@router.post("/create", response_model=BatchCreated)
async def create(req: BatchCreate, batches: BatchesDep, team: TeamDep) -> JSONBody:
    return JSONBody(BatchCreated(results=await batches.create(team, req.episodes)))


@router.post("/call", response_model=BatchCalled)
async def call(req: BatchCall, batches: BatchesDep, team: TeamDep) -> JSONBody:
    """The calls' answers, in order; the body is assembled from each call's ORS result as
    the environment wrote it (not parsed and written again)."""
    answers, usage = await batches.call(team, req.calls)
    body = f'{{"results":[{",".join(answers)}],"usage":{usage.model_dump_json()}}}'
    return JSONBody(body.encode())


@router.post("/delete", response_model=BatchDeleted)
async def delete(req: BatchDelete, batches: BatchesDep, team: TeamDep) -> JSONBody:
    return JSONBody(BatchDeleted(deleted=await batches.delete(team, req.sids)))
