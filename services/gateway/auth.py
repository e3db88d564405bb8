"""Who is calling: API keys from ``GATEWAY_KEYS_FILE``, checked before any work.

``AuthMiddleware`` (pure ASGI, right inside the timing middleware, before the body is
read) answers every ``/v1/*`` call without a valid ``Authorization: Bearer <key>`` with 401
in the one envelope, and puts the caller's ``Principal`` (team, admin, limits; never the
key) in ``request.state.principal``. ``/healthz``, ``/readyz``, ``/metrics`` and the API
docs stay open. HTTP Basic with the key as the password is accepted too: frameworks whose
remote-reward client sends no headers of its own (OpenRLHF, slime: aiohttp) authenticate
with the key in the URL, ``http://TEAM:KEY@gateway:8000/v1/compat/…``, which aiohttp turns
into that header (the URL's userinfo never reaches the gateway's path or its logs).
Without a keys file every caller is ``arbiter.keys.OPEN`` (team ``anonymous``, no limits).

``KeyStore`` re-reads the file when its modification time, size or inode changes (checked
at most every ``GATEWAY_KEYS_RELOAD_S``; a Kubernetes Secret volume swaps a symlink, which
changes the inode): new keys work and revoked ones stop working without a restart. A
well-formed key the loaded keys do not know checks the file again before it is refused, so a
key works the moment ``arbiter keys create`` has written it, not a reload period later. That
check costs one ``stat``; each version of the file is loaded at most once, so a flood of
unknown keys cannot make the gateway parse the file again and again. A file that does not
load (bad YAML, another secret) is logged and the previous keys stay.

``arbiter_gateway_team_requests_total{team, route, status}`` counts every ``/v1/*`` answer
by team (``unauthenticated`` for a 401). No key, whole or in part, is ever logged or a
label. With auth on, ``/metrics`` shows series with a ``team`` label only to an admin key
(Prometheus: ``authorization: {credentials: <admin key>}``); anyone else gets every other
series, so an open port tells no one which teams exist or what they send.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from fastapi import Request
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, generate_latest
from prometheus_client.metrics_core import Metric
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from arbiter.errors import Unauthorized
from arbiter.keys import OPEN, KeyIndex, Principal, key_id, load, secret_check
from arbiter.services.common.app import StatusRecorder, error_response
from arbiter.services.common.limits import BODY_METHODS

log = logging.getLogger("arbiter.gateway.auth")

TEAM_REQUESTS = Counter(
    "arbiter_gateway_team_requests_total",
    "Gateway /v1/* answers by team, route and status (team: the API key's; anonymous when "
    "auth is off; unauthenticated for a 401).",
    ["team", "route", "status"],
)

UNAUTHENTICATED = "unauthenticated"
# The API's paths behind a key; ORS's routes are at the root (ors.py) and under /ors/.
KEYED_PREFIXES = ("/v1/", "/nemo-gym/")
# The gateway's own paths outside the API: health, metrics, the API docs.
OWN_PREFIXES = ("/healthz", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json", "/static/")
# ORS's discovery routes that take no body need no key (the ORS spec): /health,
# /list_environments, and an environment's /tools and /splits (bare too, as the openreward
# SDK sends them). The task routes take a body: no body is read without a key.
ORS_OPEN = frozenset({"health", "list_environments"})
ORS_OPEN_PER_ENV = frozenset({"tools", "splits"})


def needs_key(path: str) -> bool:
    """Whether ``path`` is behind a key: the API's, ORS's at the root or under ``/ors/``
    but for their open discovery, and any other path (answered 404 only to a key)."""
    if path.startswith(KEYED_PREFIXES):
        return True
    if path == "/" or path.startswith(OWN_PREFIXES):
        return False
    rest = path.removeprefix("/ors").lstrip("/").split("/")
    if len(rest) == 1:
        return rest[0] not in ORS_OPEN | ORS_OPEN_PER_ENV
    return not (len(rest) == 2 and rest[1] in ORS_OPEN_PER_ENV)


class KeyStore:
    """The keys file, re-read when it changes. A bad file at start-up raises ValueError."""

    def __init__(self, path: Path, secret: str, reload_s: float):
        self.path = path
        self.secret = secret
        self.reload_s = reload_s
        self._stamp = self._stat()
        self._index = self._load()
        self._next_check = time.monotonic() + reload_s
        self._failed: tuple[int, int, int] | None = None  # the version that did not load

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> KeyIndex:
        doc = load(self.path)
        if doc.secret_check is not None and doc.secret_check != secret_check(self.secret):
            raise ValueError(
                f"keys file {self.path} was written with another GATEWAY_KEY_SECRET than this "
                "gateway's; run `arbiter keys` with the gateway's secret"
            )
        log.info(
            "keys file %s: %d active keys, %d teams",
            self.path, sum(1 for k in doc.keys if k.revoked is None), len(doc.teams),
        )  # fmt: skip
        return KeyIndex(doc, self.secret)

    def index(self) -> KeyIndex:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.reload_s
            self._refresh()
        return self._index

    def _refresh(self) -> bool:
        """Load the file if it changed since the version loaded (or last failed to load);
        whether new keys were loaded."""
        stamp = self._stat()
        if stamp is None or stamp in (self._stamp, self._failed):
            return False
        try:
            self._index = self._load()
        except ValueError as exc:
            self._failed = stamp
            log.error("%s; keeping the previous keys", exc)
            return False
        self._stamp = stamp
        return True

    def verify(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthorized(
                "no API key: send Authorization: Bearer <key> (`arbiter keys create`)",
                code="missing_api_key",
            )
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() == "basic":  # http://NAME:KEY@host/…: frameworks without headers
            key = _basic_password(key)
        elif scheme.lower() != "bearer":
            key = ""
        if not key:
            raise Unauthorized(
                "Authorization must be `Bearer <key>` (or Basic with the key as the password)",
                code="invalid_authorization",
            )
        principal = self.index().verify(key)
        if principal is None and key_id(key) is not None and self._refresh():
            principal = self._index.verify(key)  # written since the last check
        if principal is None:
            raise Unauthorized("unknown or revoked API key", code="invalid_api_key")
        return principal


def _basic_password(token: str) -> str:
    """The password of ``Basic base64(user:password)``, or "" if it is not one."""
    try:
        decoded = base64.b64decode(token, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return ""
    return decoded.partition(":")[2].strip()


def _authorization(scope: Scope) -> str | None:
    api_key = None  # ORS clients send their key as X-API-Key
    for name, value in scope["headers"]:
        if name == b"authorization":
            return str(value.decode("latin-1"))
        if name == b"x-api-key":
            api_key = "Bearer " + value.decode("latin-1")
    return api_key


class AuthMiddleware:
    """Authenticates the API's paths (``needs_key``); counts their answers per team."""

    def __init__(self, app: ASGIApp, store: KeyStore | None):
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics" and not self._admin(scope):
            response = Response(generate_latest(PUBLIC_METRICS), media_type=CONTENT_TYPE_LATEST)
            await response(scope, receive, send)
            return
        if scope["type"] != "http" or not needs_key(scope["path"]):
            if scope["type"] == "http" and scope["method"] in BODY_METHODS:
                receive = _without_body(receive)
            await self.app(scope, receive, send)
            return
        principal = OPEN
        if self.store is not None:
            try:
                principal = self.store.verify(_authorization(scope))
            except Unauthorized as exc:
                response = error_response(exc)
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                TEAM_REQUESTS.labels(UNAUTHENTICATED, "unmatched", "401").inc()
                return
        state = scope.setdefault("state", {})
        state["principal"] = principal
        if self.store is not None:  # its own body budget (services/common/limits.py)
            state["team"] = principal.team
        recorder = StatusRecorder(send)
        try:
            await self.app(scope, receive, recorder)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            TEAM_REQUESTS.labels(principal.team, route, str(recorder.status)).inc()

    def _admin(self, scope: Scope) -> bool:
        """Auth off, or an admin key: every series of /metrics."""
        if self.store is None:
            return True
        try:
            return self.store.verify(_authorization(scope)).admin
        except Unauthorized:
            return False


def _without_body(receive: Receive) -> Receive:
    """``receive`` with the request's body taken as empty. No route outside ``/v1/`` takes a
    body (they answer 404 or 405), and nobody authenticates there: read, such a body would
    hold the global body budget: four stalled uploads without a key would hold every team
    out with 429 until the body deadline. The server discards the bytes it is sent."""
    sent = False

    async def empty() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return await receive()  # after the body: a disconnect still arrives

    return empty


class _PublicMetrics:
    """The process's metrics without the families that carry a ``team`` label."""

    def collect(self) -> Iterator[Metric]:
        for metric in REGISTRY.collect():
            if not any("team" in sample.labels for sample in metric.samples):
                yield metric


PUBLIC_METRICS = _PublicMetrics()


def principal(request: Request) -> Principal:
    """The caller (set by ``AuthMiddleware``; OPEN outside it, e.g. in unit tests)."""
    found: Principal | None = getattr(request.state, "principal", None)
    return found or OPEN
