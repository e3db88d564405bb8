"""The public Open Reward Standard server: the ORS HTTP API verbatim, at the gateway's root.

ORS's clients (``ors-sdk``'s ``ORS(base_url=…)``, ``openreward``'s
``environments.get(name=…, base_url=…)``) join their paths to the host of the base URL,
dropping any path it has, so the routes are where they look: ``http://gateway:8000`` is an
ORS client's base URL. They are served under ``/ors`` too (``http://gateway:8000/ors``,
Arbiter's own clients and the first docs), the same routes, left out of the OpenAPI page.

Every route is the ORS route of the same name, forwarded to the envs service
(``envs_proxy.EnvsProxy``) and answered with its bytes: JSON, or for ``POST
/{env_name}/call`` ORS's SSE stream (``task_id`` first, keep-alive comments while the tool
runs, the ``RunToolOutput`` in ``chunk`` events, the last one ``end``), relayed as it comes.
Each per-environment route is served bare as well (``/tools``, ``/call``…): the
``openreward`` SDK sends those for an environment got without ``variant``, naming it in
``X-Deployment``.

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

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from arbiter.proto.errors import ErrorResponse
from arbiter.services.common.app import ERROR_RESPONSES
from arbiter.services.gateway.auth import principal
from arbiter.services.gateway.envs_proxy import EnvsProxy
from arbiter.services.gateway.idempotency import HEADER

PREFIX = "/ors"


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse} for code in codes}


SSE: dict[int | str, dict[str, Any]] = {
    200: {"description": "ORS's SSE stream", "content": {"text/event-stream": {}}}
}
OPEN_ERRORS = _errors(404, 422, 503, 504)
KEYED_ERRORS = _errors(401, 403, 404, 409, 422, 429, 503, 504)
_IDEMPOTENCY = Header(
    alias=HEADER,
    description="Any unique string per call, the same on its retries: a retry gets the "
    "stored answer and is counted once.",
)
IdempotencyDep = Annotated[str | None, _IDEMPOTENCY]

# (method, route, summary, keyed): the routes that need no session
OPEN_ROUTES = (
    ("GET", "/health", "ORS: the envs service is up", False),
    ("GET", "/list_environments", "ORS: the environments served here", False),
    ("POST", "/create_session", "ORS: a new session id", True),
    ("POST", "/create", "ORS: start an episode (X-Session-ID) on a task", True),
    ("POST", "/delete", "ORS: end an episode (X-Session-ID)", True),
    ("POST", "/delete_session", "ORS: forget a session id", True),
    ("POST", "/ping", "ORS: keep an episode alive", True),
)
# ... and those of one environment: /{env_name}/<route>, or bare with X-Deployment
ENV_ROUTES = (
    ("GET", "tools", "ORS: an environment's tools", False),
    ("GET", "splits", "ORS: an environment's splits", False),
    ("POST", "tasks", "ORS: the tasks of a split", False),
    ("POST", "num_tasks", "ORS SDK: how many tasks a split has", False),
    ("POST", "task", "ORS SDK: one task by index", False),
    ("POST", "task_range", "ORS SDK: the tasks of an index range", False),
    ("GET", "prompt", "ORS: the episode's prompt blocks", True),
    ("GET", "task_tools", "ORS: the episode's tools", True),
    ("POST", "call", "ORS: call a tool; the ToolOutput (reward, finished) as SSE", True),
)


async def _forward(request: Request, path: str, keyed: bool, key: str | None) -> Response:
    proxy: EnvsProxy = request.app.state.envs
    body = await request.body()
    who = principal(request) if keyed else None
    return await proxy.forward(who, request.method, path, body, request.headers, key, stream=True)


Handler = Callable[..., Awaitable[Response]]


def _handler(route: str, keyed: bool) -> Handler:
    """The route's handler: a path of its own ("/create", "/tools"), or one environment's
    ("tools": ``/{env_name}/tools``)."""
    if route.startswith("/"):

        async def handle(request: Request, key: IdempotencyDep = None) -> Response:
            return await _forward(request, route.lstrip("/"), keyed, key)

        return handle

    async def handle_env(env_name: str, request: Request, key: IdempotencyDep = None) -> Response:
        return await _forward(request, f"{env_name}/{route}", keyed, key)

    return handle_env


def build_router(prefix: str, in_schema: bool) -> APIRouter:
    """The ORS routes under ``prefix`` ("" for the root)."""
    router = APIRouter(
        prefix=prefix,
        tags=["environments (ORS)"],
        responses=ERROR_RESPONSES,
        include_in_schema=in_schema,
    )
    for method, route, summary, keyed in OPEN_ROUTES:
        errors = KEYED_ERRORS if keyed else OPEN_ERRORS
        router.add_api_route(
            route, _handler(route, keyed), methods=[method], summary=summary, responses=errors
        )
    for method, route, summary, keyed in ENV_ROUTES:
        errors = {**(SSE if route == "call" else {}), **(KEYED_ERRORS if keyed else OPEN_ERRORS)}
        router.add_api_route(
            f"/{{env_name}}/{route}",
            _handler(route, keyed),
            methods=[method],
            summary=summary,
            responses=errors,
        )
        router.add_api_route(
            f"/{route}",
            _handler(f"/{route}", keyed),
            methods=[method],
            summary=f"{summary} (X-Deployment names the environment)",
            responses=errors,
        )
    return router


# The root's routes go last (app.py): the gateway's own paths are matched first.
router = build_router("", in_schema=True)
prefixed_router = build_router(PREFIX, in_schema=False)


class OneLeadingSlash:
    """``//ping`` is ``/ping``: the openreward SDK pings ``f"{base_url}/ping"``, which
    doubles the slash when the base URL ends with one."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("//"):
            scope = {**scope, "path": "/" + path.lstrip("/"), "raw_path": None}
        await self.app(scope, receive, send)
