"""Verify routes: parse, call the handler on ``app.state``, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from arbiter.proto.components import ComponentResponse
from arbiter.proto.verify import FormatRequest, MathRequest
from arbiter.services.common.fairness import TeamDep
from arbiter.services.common.responses import JSONBody
from arbiter.services.verify.scoring import Verifier

router = APIRouter(prefix="/v1", tags=["verify"])


async def get_verifier(request: Request) -> Verifier:
    # async: a plain `def` dependency would run on the threadpool, one thread hop per request
    verifier: Verifier = request.app.state.verifier
    return verifier


VerifierDep = Annotated[Verifier, Depends(get_verifier)]


@router.post("/math", response_model=ComponentResponse, summary="math_accuracy per response")
async def math(req: MathRequest, verifier: VerifierDep, team: TeamDep) -> JSONBody:
    """1.0 when the response's final answer equals the reference, 0.0 when not, null + an
    error (timeout, invalid_reference, internal) when it could not be decided."""
    return JSONBody(await verifier.math(req, team))


@router.post("/format", response_model=ComponentResponse, summary="format per response")
async def format_(req: FormatRequest, verifier: VerifierDep) -> JSONBody:
    """``<think>…</think><answer>…</answer>`` check; strict (0/1) or partial (quarters)."""
    return JSONBody(verifier.format(req))
