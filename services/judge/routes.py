"""Judge routes: parse, call the handler on ``app.state.judge``, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from arbiter.proto.components import ComponentResponse
from arbiter.proto.graders import ModelGraderRequest, ModelGraderResponse
from arbiter.proto.judge import QualityRequest, VerifierRequest
from arbiter.services.common.fairness import TeamDep
from arbiter.services.common.responses import JSONBody
from arbiter.services.judge import model_grader
from arbiter.services.judge.scoring import Judge

router = APIRouter(prefix="/v1", tags=["judge"])


async def get_judge(request: Request) -> Judge:
    # async: a plain `def` dependency would run on the threadpool, one thread hop per request
    judge: Judge = request.app.state.judge
    return judge


JudgeDep = Annotated[Judge, Depends(get_judge)]


@router.post("/quality", response_model=ComponentResponse, summary="judge_quality per response")
async def quality(req: QualityRequest, judge: JudgeDep, team: TeamDep) -> JSONBody:
    """Rubric rating by the judge model, overall 1..scale mapped to [0, 1]."""
    return JSONBody(await judge.quality(req, team))


@router.post("/verifier", response_model=ComponentResponse, summary="judge_verifier per response")
async def verifier(req: VerifierRequest, judge: JudgeDep, team: TeamDep) -> JSONBody:
    """p(Yes) / (p(Yes) + p(No)) of the judge's one-token verdict on each response."""
    return JSONBody(await judge.verifier(req, team))


@router.post("/model_grader", response_model=ModelGraderResponse, summary="OpenAI model graders")
async def grade_model(req: ModelGraderRequest, judge: JudgeDep, team: TeamDep) -> JSONBody:
    """score_model / label_model graders: one judge call per sample (model_grader.py)."""
    return JSONBody(await model_grader.grade(judge, req, team))
