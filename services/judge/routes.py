"""Judge routes: parse, call the handler on ``app.state.judge``, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from arbiter.proto.components import ComponentResponse
from arbiter.proto.judge import QualityRequest, VerifierRequest
from arbiter.services.judge.scoring import Judge

router = APIRouter(prefix="/v1", tags=["judge"])


def get_judge(request: Request) -> Judge:
    judge: Judge = request.app.state.judge
    return judge


JudgeDep = Annotated[Judge, Depends(get_judge)]


@router.post("/quality", response_model=ComponentResponse)
async def quality(req: QualityRequest, judge: JudgeDep) -> ComponentResponse:
    """Rubric rating by the judge model, overall 1..scale mapped to [0, 1]."""
    return await judge.quality(req)


@router.post("/verifier", response_model=ComponentResponse)
async def verifier(req: VerifierRequest, judge: JudgeDep) -> ComponentResponse:
    """p(Yes) / (p(Yes) + p(No)) of the judge's one-token verdict on each response."""
    return await judge.verifier(req)
