"""The app factory every service uses: error envelope, health, readiness, metrics.

A service provides its settings, a lifespan that builds its handler object once and puts
it on ``app.state``, a router, and a readiness callable. Routes stay thin.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, Histogram, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from arbiter.errors import ArbiterError, BadRequest, Unprocessable, from_status, to_envelope
from arbiter.proto.common import Health, Readiness
from arbiter.proto.errors import ErrorResponse
from arbiter.services.common.apidocs import add_api_docs
from arbiter.services.common.disconnect import CLIENT_CLOSED, CancelOnDisconnect, route_path
from arbiter.services.common.echo import clean_envelope
from arbiter.services.common.limits import LimitsMiddleware, unreadable_body
from arbiter.services.common.settings import ServiceSettings
from arbiter.services.common.throttle import ThrottledLog

log = logging.getLogger("arbiter")
# A bug hit by every request, or a readiness check failing at every probe: one line (with
# its traceback) per kind per 10 s, with a count, not one per request.
THROTTLED = ThrottledLog(log)

REQUEST_SECONDS = Histogram(
    "arbiter_http_request_seconds",
    "HTTP request latency by service, route and status.",
    ["service", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# A readiness check passes with "ok"; "not configured: …" (an optional dependency left out on
# purpose) and "degraded: …" (serving without it, e.g. a cache) are reported but pass too.
NON_BLOCKING_PREFIXES = ("not configured", "degraded")


def check_passes(value: str) -> bool:
    return value == "ok" or value.startswith(NON_BLOCKING_PREFIXES)


# The error statuses every route documents, each with the one envelope as its body.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 413, 415, 422, 429, 500, 503, 504)
}

ReadyCheck = Callable[[FastAPI], Awaitable[dict[str, str]]]
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


# The code an error gets when the code that raised it gave none: every error has one.
DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "rate_limited",
    500: "internal_error",
    502: "bad_response",
    503: "unavailable",
    504: "timeout",
}


def error_response(exc: BaseException) -> JSONResponse:
    """Any exception as the one envelope (``arbiter.errors.to_envelope``), as a response.

    What it echoes is cleaned (``echo.clean_envelope``: no lone surrogate, no megabytes of
    input); an exception that is not an ``ArbiterError`` is a bug whose text may name
    internals (a URL, a path, a Redis command): the caller gets its type, the log the rest."""
    status, body = to_envelope(exc)
    if not isinstance(exc, ArbiterError):
        body.error.message = f"internal error ({type(exc).__name__}); the service's log has why"
    clean_envelope(body)
    if body.error.code is None:
        body.error.code = DEFAULT_CODES.get(status, "bad_request" if status < 500 else "error")
    headers = exc.headers if isinstance(exc, ArbiterError) else None
    return JSONResponse(status_code=status, content=body.model_dump(), headers=headers)


# Where FastAPI found a value: the first element of an error's ``loc``, not part of its
# name (a field may itself be called ``query``: OpenRLHF's is).
LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})


def field_path(loc: tuple[Any, ...] | list[Any]) -> list[Any]:
    """An error's ``loc`` without its location kind: the field's own path."""
    return list(loc[1:]) if loc and loc[0] in LOCATIONS else list(loc)


def _loc_to_param(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in field_path(loc))


ErrorPicker = Callable[[list[dict[str, Any]]], tuple[str, str]]


def first_error(errors: list[dict[str, Any]]) -> tuple[str, str]:
    """(param, message) of the first validation error: the field as a dotted path."""
    first = errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _loc_to_param(tuple(first.get("loc", ()))), f"{first.get('msg')}{more}"


# pydantic's error type → the envelope's ``code`` (a limit that was hit says which);
# any other type is a ``validation_error``.
CODES = {
    "string_too_long": "text_too_long",  # one text past MAX_TEXT_CHARS
    "too_long": "list_too_long",  # a list past its bound: groups, responses, inputs
    "too_many_chars": "too_many_chars",  # the request's texts past <PREFIX>_MAX_TOTAL_CHARS
    "too_deep": "too_deep",  # free-form JSON (params) nested past MAX_JSON_DEPTH
}


def validation_response(
    exc: RequestValidationError, pick: ErrorPicker = first_error
) -> JSONResponse:
    """The envelope for a request that failed validation; ``pick`` names the field to blame."""
    errors = list(exc.errors())
    if not errors:
        return error_response(Unprocessable("invalid request", code="validation_error"))
    if errors[0].get("type") == "json_invalid":
        detail = (errors[0].get("ctx") or {}).get("error", "")
        message = f"the body is not valid JSON: {detail}".rstrip(": ")
        return error_response(BadRequest(message, code="invalid_json"))
    # A limit checked over the whole request names the field it crossed at in ctx.param.
    errors = [_with_ctx_param(e) for e in errors]
    param, msg = pick(errors)
    message = f"{param}: {msg}" if param else msg
    # The code of the first error that hit a limit (a union's other branches report type
    # errors first), else a plain validation error.
    code = next((CODES[t] for e in errors if (t := str(e.get("type"))) in CODES), None)
    code = code or "validation_error"
    return error_response(Unprocessable(message, param=param or None, code=code))


def _with_ctx_param(error: dict[str, Any]) -> dict[str, Any]:
    where = (error.get("ctx") or {}).get("param")
    if not isinstance(where, str):
        return error
    return {**error, "loc": (*error.get("loc", ()), *where.split("."))}


async def _validation_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_response(exc)


async def _http_handler(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc.__cause__, ClientDisconnect):  # FastAPI's body read: the client left
        return await _client_disconnect_handler(_, exc.__cause__)
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        return error_response(unreadable_body(exc.__cause__))  # FastAPI's: not UTF-8, too deep
    return error_response(from_status(exc.status_code, str(exc.detail)))


async def _client_disconnect_handler(_: Request, exc: Exception) -> Response:
    """A route that read the body itself saw its client leave: 499, nobody reads it."""
    return Response(status_code=CLIENT_CLOSED)


async def _error_handler(_: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, ArbiterError):
        THROTTLED.error(("unhandled", type(exc).__name__), "unhandled error", exc_info=exc)
    return error_response(exc)


class StatusRecorder:
    """Wraps an ASGI ``send`` and remembers the response's status (500 until one is sent)."""

    __slots__ = ("send", "status")

    def __init__(self, send: Send):
        self.send = send
        self.status = 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


class TimingMiddleware:
    """Pure ASGI middleware (cheap): one histogram observation per HTTP request."""

    def __init__(self, app: ASGIApp, service: str):
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        recorder = StatusRecorder(send)
        try:
            await self.app(scope, receive, recorder)
        finally:
            path = route_path(scope)
            REQUEST_SECONDS.labels(self.service, path, str(recorder.status)).observe(
                time.perf_counter() - start
            )
            if recorder.status == CLIENT_CLOSED:  # the client's choice: info, never an error
                log.info(
                    "%s %s: the client disconnected before its answer (499)", scope["method"], path
                )


def create_service_app(
    *,
    service: str,
    title: str,
    router: APIRouter,
    lifespan: Lifespan,
    ready: ReadyCheck,
    description: str = "",
    settings: ServiceSettings | None = None,
) -> FastAPI:
    """Build a FastAPI app with Arbiter's common endpoints and error handling; with
    ``settings``, the service's limits are enforced before any work (``LimitsMiddleware``)."""

    async def readyz(request: Request) -> JSONResponse:
        try:
            checks = await ready(request.app)
        except Exception as exc:  # readiness must answer, never raise; unauthenticated,
            THROTTLED.warning(  # so no details here: the log has them
                ("readiness", type(exc).__name__), "readiness check failed", exc_info=exc
            )
            checks = {"readiness": f"check failed ({type(exc).__name__})"}
        body = Readiness(ready=all(check_passes(v) for v in checks.values()), checks=checks)
        return JSONResponse(status_code=200 if body.ready else 503, content=body.model_dump())

    async def healthz() -> Health:
        return Health()

    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app = FastAPI(
        title=title,
        description=description,
        version="1.0.0",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc: served offline by add_api_docs
        redoc_url=None,
    )
    add_api_docs(app)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(ArbiterError, _error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(ClientDisconnect, _client_disconnect_handler)
    app.add_exception_handler(Exception, _error_handler)
    app.include_router(router, responses=ERROR_RESPONSES)
    app.add_api_route("/healthz", healthz, methods=["GET"], tags=["ops"])
    app.add_api_route(
        "/readyz",
        readyz,
        methods=["GET"],
        tags=["ops"],
        responses={200: {"model": Readiness}, 503: {"model": Readiness}},
    )
    app.add_api_route("/metrics", metrics, methods=["GET"], tags=["ops"], include_in_schema=False)
    app.add_middleware(CancelOnDisconnect, service=service)  # inside the timing: 499s timed
    if settings is not None:
        app.add_middleware(
            LimitsMiddleware,
            max_body_bytes=settings.max_body_bytes,
            max_buffered_bytes=settings.max_buffered_bytes,
            max_team_buffered_bytes=settings.team_buffered_bytes(),
            body_timeout_s=settings.body_timeout_s,
            max_total_chars=settings.max_total_chars,
            env_prefix=str(settings.model_config.get("env_prefix", "")),
        )
    app.add_middleware(TimingMiddleware, service=service)  # outermost: times refusals too
    return app
