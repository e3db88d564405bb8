"""Verify routes: parse, call the handler on ``app.state``, return."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from arbiter.proto.components import ComponentResponse
from arbiter.proto.verify import FormatRequest, MathRequest
from arbiter.services.verify.scoring import Verifier

router = APIRouter(prefix="/v1", tags=["verify"])


def get_verifier(request: Request) -> Verifier:
    verifier: Verifier = request.app.state.verifier
    return verifier


VerifierDep = Annotated[Verifier, Depends(get_verifier)]


def _json(body: ComponentResponse) -> Any:
    """Serialise once (the model is already valid), skipping FastAPI's re-validation of
    the response model; ``response_model`` still documents the shape."""
    return Response(body.model_dump_json(), media_type="application/json")


@router.post("/math", response_model=ComponentResponse, summary="math_accuracy per response")
async def math(req: MathRequest, verifier: VerifierDep) -> Any:
    """1.0 when the response's final answer equals the reference, 0.0 when not, null + an
    error (timeout, invalid_reference, internal) when it could not be decided."""
    return _json(await verifier.math(req))


@router.post("/format", response_model=ComponentResponse, summary="format per response")
async def format_(req: FormatRequest, verifier: VerifierDep) -> Any:
    """``<think>…</think><answer>…</answer>`` check; strict (0/1) or partial (quarters)."""
    return _json(verifier.format(req))
