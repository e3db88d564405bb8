"""ORS routes, at the service's root: parse, call ``app.state.envs``, return.

Discovery (``/health``, ``/list_environments``, ``/{env}/tools``, ``/{env}/splits``,
``/{env}/tasks``) is open; every session route needs the team header the gateway sets
(``proto.common.TEAM_HEADER``) and, but for ``/create_session``, ``X-Session-ID``.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from arbiter.errors import BadRequest, Unprocessable
from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.envs import (
    SESSION_HEADER,
    USAGE_HEADER,
    CreateEpisode,
    GetTask,
    GetTaskRange,
    ListTasks,
    ListToolsOutput,
    NumTasks,
    SessionId,
    Split,
    Status,
    TaskOutput,
    TasksOutput,
    TextBlock,
    ToolCall,
)
from arbiter.services.common.app import error_response
from arbiter.services.common.fairness import team_of
from arbiter.services.common.responses import JSONBody
from arbiter.services.envs.serving import AfterRun, Envs, usage_header

router = APIRouter(tags=["envs"])
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def get_envs(request: Request) -> Envs:
    envs: Envs = request.app.state.envs
    return envs


async def get_team(request: Request) -> str:
    team = team_of(request)
    if not team:
        raise BadRequest(
            f"{TEAM_HEADER}: required (the gateway sets it; sessions are per team)",
            param=TEAM_HEADER,
        )
    return team


async def get_sid(request: Request) -> str:
    sid = (request.headers.get(SESSION_HEADER) or "").strip()
    if not sid or len(sid) > 128:
        raise BadRequest(
            f"{SESSION_HEADER}: required, at most 128 characters (from /create_session)",
            param=SESSION_HEADER,
        )
    return sid


EnvsDep = Annotated[Envs, Depends(get_envs)]
TeamDep = Annotated[str, Depends(get_team)]
SidDep = Annotated[str, Depends(get_sid)]


def _json(value: object) -> Response:
    return Response(json.dumps(value), media_type="application/json")


@router.get("/health", response_model=Status)
async def health() -> JSONBody:
    return JSONBody(Status())


@router.get("/list_environments", response_model=list[str])
async def list_environments(envs: EnvsDep) -> Response:
    return _json(envs.names())


@router.get("/{env_name}/tools", response_model=ListToolsOutput)
async def tools(env_name: str, envs: EnvsDep) -> JSONBody:
    return JSONBody(envs.tools(env_name))


@router.get("/{env_name}/splits", response_model=list[Split])
async def splits(env_name: str, envs: EnvsDep) -> Response:
    return _json([s.model_dump() for s in envs.splits(env_name)])


@router.post("/{env_name}/tasks", response_model=TasksOutput)
async def tasks(env_name: str, req: ListTasks, envs: EnvsDep) -> Response:
    found = envs.tasks(env_name, req.split)
    return _json({"tasks": found, "env_name": env_name})


# The openreward SDK's index-based task routes, beside ORS's /tasks.
@router.post("/{env_name}/num_tasks", response_model=NumTasks)
async def num_tasks(env_name: str, req: ListTasks, envs: EnvsDep) -> JSONBody:
    return JSONBody(NumTasks(num_tasks=len(envs.tasks(env_name, req.split))))


@router.post("/{env_name}/task", response_model=TaskOutput)
async def task(env_name: str, req: GetTask, envs: EnvsDep) -> Response:
    found = envs.env(env_name).taskset.task(req.split, req.index)
    return _json({"task": found, "env_name": env_name})


@router.post("/{env_name}/task_range", response_model=TasksOutput)
async def task_range(env_name: str, req: GetTaskRange, envs: EnvsDep) -> Response:
    found = envs.tasks(env_name, req.split)[req.start : req.stop]
    return _json({"tasks": found, "env_name": env_name})


@router.post("/create_session")
async def create_session(envs: EnvsDep, team: TeamDep) -> Response:
    """A new sid, as ORS's SSE: ``task_id`` (the sid), then ``end``."""
    body = f"event: task_id\ndata: {envs.new_sid()}\n\nevent: end\ndata: \n\n"
    return Response(body, media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("/create", response_model=SessionId)
async def create(req: CreateEpisode, envs: EnvsDep, team: TeamDep, sid: SidDep) -> JSONBody:
    await envs.create(team, sid, req)
    return JSONBody(SessionId(sid=sid))


@router.get("/{env_name}/prompt", response_model=list[TextBlock])
async def prompt(env_name: str, envs: EnvsDep, team: TeamDep, sid: SidDep) -> Response:
    blocks = await envs.prompt(team, sid, env_name)
    return _json([b.model_dump() for b in blocks])


@router.post("/{env_name}/call")
async def call(env_name: str, req: ToolCall, envs: EnvsDep, team: TeamDep, sid: SidDep) -> Response:
    """The tool's result as ORS's SSE body, computed before the first byte is sent: a
    failure not the policy's (sandbox unavailable) is a 503/504 envelope the client retries.
    ``X-Arbiter-Usage`` says what the call cost."""
    if req.task_id is not None and not req.task_id.isprintable():
        # it is echoed as an SSE data line: a line break would let it forge events
        raise Unprocessable("task_id: printable characters only, no line breaks", param="task_id")
    try:
        called = await envs.call(team, sid, env_name, req)
    except AfterRun as exc:
        answer = error_response(exc.error)
        answer.headers[USAGE_HEADER] = usage_header(exc.usage)
        return answer
    headers = {**SSE_HEADERS, USAGE_HEADER: usage_header(called.usage)}
    body = called.sse(req.task_id or envs.new_sid())
    return Response(body, media_type="text/event-stream", headers=headers)


@router.post("/ping", response_model=Status)
async def ping(envs: EnvsDep, team: TeamDep, sid: SidDep) -> JSONBody:
    await envs.store.touch(team, sid)
    return JSONBody(Status())


@router.post("/delete", response_model=SessionId)
async def delete(envs: EnvsDep, team: TeamDep, sid: SidDep) -> JSONBody:
    await envs.store.delete(team, sid)
    return JSONBody(SessionId(sid=sid))


@router.post("/delete_session", response_model=SessionId)
async def delete_session(envs: EnvsDep, team: TeamDep, sid: SidDep) -> JSONBody:
    await envs.store.delete(team, sid)
    return JSONBody(SessionId(sid=sid))
