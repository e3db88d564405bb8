"""The public Open Reward Standard server: ``/ors/...``, the ORS HTTP API verbatim.

An ORS client's base URL is ``http://gateway:8000/ors``. Every route is the ORS route of
the same name, forwarded to the envs service (``envs_proxy.EnvsProxy``) and answered with
its bytes: JSON, or for ``POST /{env_name}/call`` the ORS SSE body (``event: task_id``,
``event: end`` with the ``ToolOutput``, or ``event: error``).

As the ORS specification has it, discovery that takes no body (``/health``,
``/list_environments``, ``/{env_name}/tools``, ``/{env_name}/splits``) needs no key. The
task routes (``/{env_name}/tasks``, and the SDK's ``num_tasks``, ``task``, ``task_range``)
take a body, and the gateway reads no body without a key (a stalled one would hold the
body budget every team shares: ``auth.py``); they carry no team. Every session route needs
an API key (``Authorization: Bearer <key>``, or ``X-API-Key: <key>`` as ORS clients send
it), runs as the key's team (another team's session is a 404), takes ``Idempotency-Key``
on every POST, and a tool call is held to the team's environments quota
(``envs_quota.py``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from starlette.responses import Response

from arbiter.proto.errors import ErrorResponse
from arbiter.services.common.app import ERROR_RESPONSES
from arbiter.services.gateway.auth import principal
from arbiter.services.gateway.envs_proxy import EnvsProxy
from arbiter.services.gateway.idempotency import HEADER

PREFIX = "/ors"


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse} for code in codes}


SSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "The ORS SSE body", "content": {"text/event-stream": {}}}
}
OPEN_ERRORS = _errors(404, 422, 503, 504)
KEYED_ERRORS = _errors(401, 403, 404, 409, 422, 429, 503, 504)

router = APIRouter(prefix=PREFIX, tags=["environments (ORS)"], responses=ERROR_RESPONSES)
_IDEMPOTENCY = Header(
    alias=HEADER,
    description="Any unique string per call, the same on its retries: a retry gets the "
    "stored answer and is counted once.",
)
IdempotencyDep = Annotated[str | None, _IDEMPOTENCY]


async def _open(request: Request, path: str) -> Response:
    proxy: EnvsProxy = request.app.state.envs
    body = await request.body()
    return await proxy.forward(None, request.method, path, body, request.headers)


async def _keyed(request: Request, path: str, key: str | None = None) -> Response:
    proxy: EnvsProxy = request.app.state.envs
    body = await request.body()
    who = principal(request)
    return await proxy.forward(who, request.method, path, body, request.headers, key)


@router.get("/health", summary="ORS: the envs service is up", responses=OPEN_ERRORS)
async def health(request: Request) -> Response:
    return await _open(request, "health")


@router.get(
    "/list_environments", summary="ORS: the environments served here", responses=OPEN_ERRORS
)
async def list_environments(request: Request) -> Response:
    return await _open(request, "list_environments")


@router.get("/{env_name}/tools", summary="ORS: an environment's tools", responses=OPEN_ERRORS)
async def tools(env_name: str, request: Request) -> Response:
    return await _open(request, f"{env_name}/tools")


@router.get("/{env_name}/splits", summary="ORS: an environment's splits", responses=OPEN_ERRORS)
async def splits(env_name: str, request: Request) -> Response:
    return await _open(request, f"{env_name}/splits")


@router.post("/{env_name}/tasks", summary="ORS: the tasks of a split", responses=OPEN_ERRORS)
async def tasks(env_name: str, request: Request) -> Response:
    return await _open(request, f"{env_name}/tasks")


@router.post(
    "/{env_name}/num_tasks", summary="ORS SDK: how many tasks a split has", responses=OPEN_ERRORS
)
async def num_tasks(env_name: str, request: Request) -> Response:
    return await _open(request, f"{env_name}/num_tasks")


@router.post("/{env_name}/task", summary="ORS SDK: one task by index", responses=OPEN_ERRORS)
async def task(env_name: str, request: Request) -> Response:
    return await _open(request, f"{env_name}/task")


@router.post(
    "/{env_name}/task_range", summary="ORS SDK: the tasks of an index range", responses=OPEN_ERRORS
)
async def task_range(env_name: str, request: Request) -> Response:
    return await _open(request, f"{env_name}/task_range")


@router.post("/create_session", summary="ORS: a new session id", responses=KEYED_ERRORS)
async def create_session(request: Request, key: IdempotencyDep = None) -> Response:
    return await _keyed(request, "create_session", key)


@router.post(
    "/create", summary="ORS: start an episode (X-Session-ID) on a task", responses=KEYED_ERRORS
)
async def create(request: Request, key: IdempotencyDep = None) -> Response:
    return await _keyed(request, "create", key)


@router.post("/delete", summary="ORS: end an episode (X-Session-ID)", responses=KEYED_ERRORS)
async def delete(request: Request, key: IdempotencyDep = None) -> Response:
    return await _keyed(request, "delete", key)


@router.post("/delete_session", summary="ORS: forget a session id", responses=KEYED_ERRORS)
async def delete_session(request: Request, key: IdempotencyDep = None) -> Response:
    return await _keyed(request, "delete_session", key)


@router.post("/ping", summary="ORS: keep an episode alive", responses=KEYED_ERRORS)
async def ping(request: Request, key: IdempotencyDep = None) -> Response:
    return await _keyed(request, "ping", key)


@router.get(
    "/{env_name}/prompt", summary="ORS: the episode's prompt blocks", responses=KEYED_ERRORS
)
async def prompt(env_name: str, request: Request) -> Response:
    return await _keyed(request, f"{env_name}/prompt")


@router.post(
    "/{env_name}/call",
    summary="ORS: call a tool; the ToolOutput (reward, finished) as an SSE body",
    responses={**SSE, **KEYED_ERRORS},
)
async def call(env_name: str, request: Request, key: IdempotencyDep = None) -> Response:
    return await _keyed(request, f"{env_name}/call", key)
