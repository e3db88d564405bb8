"""ORS routes, at the service's root: parse, call ``app.state.envs``, return.

Discovery (``/health``, ``/list_environments``, ``/{env}/tools``, ``/{env}/splits``,
``/{env}/tasks``) is open; every session route needs the team header the gateway sets
(``proto.common.TEAM_HEADER``) and, but for ``/create_session``, ``X-Session-ID``.

Every per-environment route is served bare as well (``/tools``, ``/call``…), as the
``openreward`` SDK sends them for an environment got without ``variant``: the environment
is then the one its ``X-Deployment`` header names (``get(name=…)``), or, on a session
route, the episode's own.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from starlette.responses import Response, StreamingResponse

from arbiter.errors import BadRequest, NotFound, Unprocessable
from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.envs import (
    DEPLOYMENT_HEADER,
    SESSION_HEADER,
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
from arbiter.services.common.fairness import team_of
from arbiter.services.common.responses import JSONBody
from arbiter.services.envs.calls import sse_stream
from arbiter.services.envs.serving import Envs

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


async def get_deployed(
    request: Request, deployment: Annotated[str | None, Header(alias=DEPLOYMENT_HEADER)] = None
) -> str:
    """The environment of a bare route: the one ``X-Deployment`` names (the ``openreward``
    SDK sends the name given to ``environments.get``; ``owner/name`` is taken as ``name``)."""
    name = (deployment or "").rsplit("/", 1)[-1].strip()
    if not name:
        raise NotFound(
            f"env_name: name the environment in the path (/{{env_name}}{request.url.path}) "
            f"or in {DEPLOYMENT_HEADER} (the openreward SDK: environments.get(name=…))",
            param="env_name",
            code="unknown_environment",
        )
    return name


EnvsDep = Annotated[Envs, Depends(get_envs)]
DeployedDep = Annotated[str, Depends(get_deployed)]
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


@router.get("/tools", response_model=ListToolsOutput)
async def tools_bare(env_name: DeployedDep, envs: EnvsDep) -> JSONBody:
    return JSONBody(envs.tools(env_name))


@router.get("/{env_name}/splits", response_model=list[Split])
async def splits(env_name: str, envs: EnvsDep) -> Response:
    return _json([s.model_dump() for s in envs.splits(env_name)])


@router.get("/splits", response_model=list[Split])
async def splits_bare(env_name: DeployedDep, envs: EnvsDep) -> Response:
    return await splits(env_name, envs)


@router.post("/{env_name}/tasks", response_model=TasksOutput)
async def tasks(env_name: str, req: ListTasks, envs: EnvsDep) -> Response:
    name = envs.env(env_name).name
    return _json({"tasks": envs.tasks(name, req.split), "env_name": name})


@router.post("/tasks", response_model=TasksOutput)
async def tasks_bare(req: ListTasks, env_name: DeployedDep, envs: EnvsDep) -> Response:
    return await tasks(env_name, req, envs)


# The openreward SDK's index-based task routes, beside ORS's /tasks.
@router.post("/{env_name}/num_tasks", response_model=NumTasks)
async def num_tasks(env_name: str, req: ListTasks, envs: EnvsDep) -> JSONBody:
    return JSONBody(NumTasks(num_tasks=len(envs.tasks(env_name, req.split))))


@router.post("/num_tasks", response_model=NumTasks)
async def num_tasks_bare(req: ListTasks, env_name: DeployedDep, envs: EnvsDep) -> JSONBody:
    return await num_tasks(env_name, req, envs)


@router.post("/{env_name}/task", response_model=TaskOutput)
async def task(env_name: str, req: GetTask, envs: EnvsDep) -> Response:
    env = envs.env(env_name)
    return _json({"task": env.taskset.task(req.split, req.index), "env_name": env.name})


@router.post("/task", response_model=TaskOutput)
async def task_bare(req: GetTask, env_name: DeployedDep, envs: EnvsDep) -> Response:
    return await task(env_name, req, envs)


@router.post("/{env_name}/task_range", response_model=TasksOutput)
async def task_range(env_name: str, req: GetTaskRange, envs: EnvsDep) -> Response:
    name = envs.env(env_name).name
    return _json({"tasks": envs.tasks(name, req.split)[req.start : req.stop], "env_name": name})


@router.post("/task_range", response_model=TasksOutput)
async def task_range_bare(req: GetTaskRange, env_name: DeployedDep, envs: EnvsDep) -> Response:
    return await task_range(env_name, req, envs)


@router.post("/create_session")
async def create_session(envs: EnvsDep, team: TeamDep) -> Response:
    """A new sid, as ORS's SSE: ``task_id`` (the sid), then ``end``."""
    body = f"event: task_id\ndata: {envs.new_sid()}\n\nevent: end\ndata: \n\n"
    return Response(body, media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("/create", response_model=SessionId)
async def create(
    req: CreateEpisode,
    envs: EnvsDep,
    team: TeamDep,
    sid: SidDep,
    deployment: Annotated[str | None, Header(alias=DEPLOYMENT_HEADER)] = None,
) -> JSONBody:
    """``env_name`` from the body, else from ``X-Deployment`` (the openreward SDK sends
    none in the body for an environment got without ``variant``). ``secrets`` (the body's,
    or the SDKs' ``X-Secrets`` header) are accepted and not kept: no environment here
    needs one."""
    if req.env_name is None and deployment:
        req.env_name = deployment.rsplit("/", 1)[-1].strip()[:64] or None
    await envs.create(team, sid, req)
    return JSONBody(SessionId(sid=sid))


@router.get("/{env_name}/prompt", response_model=list[TextBlock])
async def prompt(env_name: str, envs: EnvsDep, team: TeamDep, sid: SidDep) -> Response:
    blocks = await envs.prompt(team, sid, env_name)
    return _json([b.model_dump() for b in blocks])


@router.get("/prompt", response_model=list[TextBlock])
async def prompt_bare(envs: EnvsDep, team: TeamDep, sid: SidDep) -> Response:
    return await prompt("", envs, team, sid)


@router.get("/{env_name}/task_tools", response_model=ListToolsOutput)
async def task_tools(env_name: str, envs: EnvsDep, team: TeamDep, sid: SidDep) -> JSONBody:
    """The episode's tools (ORS: the environment's and its task's; no task adds any here)."""
    return JSONBody(await envs.task_tools(team, sid, env_name))


@router.get("/task_tools", response_model=ListToolsOutput)
async def task_tools_bare(envs: EnvsDep, team: TeamDep, sid: SidDep) -> JSONBody:
    return await task_tools("", envs, team, sid)


@router.post("/{env_name}/call")
async def call(
    env_name: str, req: ToolCall, envs: EnvsDep, team: TeamDep, sid: SidDep
) -> StreamingResponse:
    """ORS's SSE stream (``calls.py``): ``task_id`` first, keep-alive comments while the
    tool runs, the result in chunks. A ``task_id`` already running or answered (within
    60 s) is attached to, never run again. What is wrong with the request itself (no such
    episode, another environment) is an error envelope before the stream."""
    if req.task_id is not None and not req.task_id.isprintable():
        # it is echoed as an SSE data line: a line break would let it forge events
        raise Unprocessable("task_id: printable characters only, no line breaks", param="task_id")
    running = await envs.call(team, sid, env_name, req)
    stream = sse_stream(
        running.task_id, running.outcome, running.claim, envs.settings.sse_keepalive_s
    )
    return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("/call")
async def call_bare(req: ToolCall, envs: EnvsDep, team: TeamDep, sid: SidDep) -> StreamingResponse:
    return await call("", req, envs, team, sid)


@router.post("/ping", response_model=Status)
async def ping(envs: EnvsDep, team: TeamDep, sid: SidDep) -> JSONBody:
    await envs.store.touch(team, sid)
    return JSONBody(Status())


@router.post("/delete", response_model=SessionId)
async def delete(envs: EnvsDep, team: TeamDep, sid: SidDep) -> JSONBody:
    await envs.delete(team, sid)
    return JSONBody(SessionId(sid=sid))


@router.post("/delete_session", response_model=SessionId)
async def delete_session(envs: EnvsDep, team: TeamDep, sid: SidDep) -> JSONBody:
    await envs.delete(team, sid)
    return JSONBody(SessionId(sid=sid))
