"""Sandbox routes: parse, call the runner on ``app.state``, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from arbiter.proto.components import ComponentResponse
from arbiter.proto.sandbox import CodeTestsRequest, PythonGraderRequest
from arbiter.services.common.fairness import TeamDep
from arbiter.services.common.responses import JSONBody
from arbiter.services.sandbox.scoring import Runner

router = APIRouter(prefix="/v1", tags=["sandbox"])


async def get_runner(request: Request) -> Runner:
    # async: a plain `def` dependency would run on the threadpool, one thread hop per request
    runner: Runner = request.app.state.runner
    return runner


RunnerDep = Annotated[Runner, Depends(get_runner)]


@router.post("/code_tests", response_model=ComponentResponse, summary="code_tests per response")
async def code_tests(req: CodeTestsRequest, runner: RunnerDep, team: TeamDep) -> JSONBody:
    """The response's program (its last fenced code block, or all of it) against the
    group's tests: the share passed, or 1/0 with ``mode: all``; per-test reasons in info."""
    return JSONBody(await runner.code_tests(req, team))


@router.post(
    "/python_grader", response_model=ComponentResponse, summary="python_grader per response"
)
async def python_grader(req: PythonGraderRequest, runner: RunnerDep, team: TeamDep) -> JSONBody:
    """``grade(sample, item)`` from ``params.source``, run in the sandbox per response."""
    return JSONBody(await runner.python_grader(req, team))
