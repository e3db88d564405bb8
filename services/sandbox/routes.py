"""Sandbox routes: parse, call the runner (or the sessions) on ``app.state``, return."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from arbiter.proto.components import ComponentResponse
from arbiter.proto.sandbox import (
    CellResult,
    CodeTestsRequest,
    OpenSession,
    PythonGraderRequest,
    RunCell,
    SessionClosed,
    SessionInfo,
)
from arbiter.services.common.fairness import TeamDep
from arbiter.services.common.responses import JSONBody
from arbiter.services.sandbox.scoring import Runner
from arbiter.services.sandbox.sessions import Sessions

router = APIRouter(prefix="/v1", tags=["sandbox"])


async def get_runner(request: Request) -> Runner:
    # async: a plain `def` dependency would run on the threadpool, one thread hop per request
    runner: Runner = request.app.state.runner
    return runner


async def get_sessions(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


RunnerDep = Annotated[Runner, Depends(get_runner)]
SessionsDep = Annotated[Sessions, Depends(get_sessions)]
SessionId = Annotated[str, Path(max_length=128, description="From POST /v1/sessions.")]


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


@router.post("/sessions", response_model=SessionInfo, summary="open a live Python interpreter")
async def open_session(req: OpenSession, sessions: SessionsDep, team: TeamDep) -> JSONBody:
    """An interpreter of the team's own, in a sandbox of its own, kept until it is closed
    or idle past SANDBOX_SESSION_IDLE_S; 429 ``session_limit`` past the team's count."""
    return JSONBody(await sessions.open(team, req))


@router.post("/sessions/{session_id}/run", response_model=CellResult, summary="run one cell")
async def run_cell(
    session_id: SessionId, req: RunCell, sessions: SessionsDep, team: TeamDep
) -> JSONBody:
    """The cell runs once, in the session's interpreter: what it printed (stdout, stderr)
    as text, its CPU time, and how it ended."""
    return JSONBody(await sessions.run(team, session_id, req.code))


@router.delete("/sessions/{session_id}", response_model=SessionClosed, summary="close it")
async def close_session(session_id: SessionId, sessions: SessionsDep, team: TeamDep) -> JSONBody:
    """Kill the session's interpreter and everything it started."""
    sessions.close_session(team, session_id)
    return JSONBody(SessionClosed(id=session_id))
