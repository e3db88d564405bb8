"""Limits enforced before any work: a pure-ASGI middleware in front of every service.

For a request with a body it

1. refuses a ``Content-Type`` that is not JSON (415 ``unsupported_media_type``) without
   reading the body (an empty body passes, whatever it is labelled);
2. refuses a body whose ``Content-Length`` is over ``<PREFIX>_MAX_BODY_BYTES`` at once, and
   counts the bytes of one sent in chunks, refusing it as soon as the count passes the
   limit (413 ``body_too_large``): a 50 MB body is never held in memory. The bodies of all
   requests in progress together are held to ``<PREFIX>_MAX_BUFFERED_BYTES`` (429
   ``too_busy``, retryable), so memory stays bounded however many arrive at once. The
   bodies of one team (``scope["state"]["team"]``, which the gateway's authentication
   sets) are held to ``<PREFIX>_MAX_TEAM_BUFFERED_BYTES`` as well, so one team's uploads
   never turn another team away; and a body must arrive whole within
   ``<PREFIX>_BODY_TIMEOUT_S`` (408 ``body_timeout``), so a stalled upload gives its bytes
   back: without the deadline, four stalled 32 MiB uploads of one team hold every team
   out with 429 for as long as their sockets stay open;
3. refuses a string holding a lone UTF-16 surrogate (422 ``invalid_unicode``, ``param``
   naming the field): JSON can spell one (``"\\ud800"``), Python's parser accepts it, and
   nothing downstream can encode it. Only a body that contains such an escape is parsed
   here; every other body passes on untouched;
4. puts the service's per-request bounds in force (``arbiter.proto.limits.REQUEST_LIMITS``)
   for the request models to check while they validate.

The body it read is handed to the app as one message; after that the app's ``receive``
is the server's own, so a client's disconnect still reaches the route.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Iterator
from email.message import Message as EmailMessage
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from arbiter.errors import (
    ArbiterError,
    BadRequest,
    PayloadTooLarge,
    RateLimited,
    Unprocessable,
    UnsupportedMediaType,
)
from arbiter.proto.limits import REQUEST_LIMITS, RequestLimits
from arbiter.services.common.disconnect import disconnected
from arbiter.services.common.echo import clean_envelope

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

# A JSON escape of a UTF-16 surrogate (high or low); a valid pair decodes to one astral
# character, so only a body with one of these can hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


@functools.lru_cache(maxsize=64)  # a handful of distinct headers; parsing one costs ~10 us
def is_json_type(content_type: str) -> bool:
    message = EmailMessage()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _strings(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every string of a parsed JSON value (keys too) with its dotted path; iterative."""
    stack: list[tuple[tuple[str, ...], Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for key, child in item.items():
                yield (*where, key), key
                stack.append(((*where, key), child))
        elif isinstance(item, list):
            stack.extend(((*where, str(i)), child) for i, child in enumerate(item))


def lone_surrogate(body: bytes) -> str | None:
    """The dotted path of the first string holding a lone surrogate, or None."""
    if not _SURROGATE_ESCAPE.search(body):
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the app's parser answers that
    for where, text in _strings(value):
        if _SURROGATE.search(text):
            return ".".join(where) or "body"
    return None


class LimitsMiddleware:
    """See the module docstring. ``env_prefix`` names the settings in error messages."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_total_chars: int,
        env_prefix: str,
        max_buffered_bytes: int | None = None,
        max_team_buffered_bytes: int | None = None,
        body_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_buffered_bytes = max_buffered_bytes or 4 * max_body_bytes
        self.max_team_buffered_bytes = max_team_buffered_bytes or self.max_buffered_bytes // 2
        self.body_timeout_s = body_timeout_s
        self.buffered = 0  # bytes of the bodies of every request in progress
        self.team_buffered: dict[str, int] = {}  # the same, per team
        self.limits = RequestLimits(max_total_chars=max_total_chars)
        self.prefix = env_prefix
        self.setting = f"{env_prefix}MAX_BODY_BYTES"

    def _too_busy(self) -> RateLimited:
        err = RateLimited(
            f"the bodies of the requests in progress already take {self.buffered} bytes "
            f"(at most {self.max_buffered_bytes}, {self.prefix}MAX_BUFFERED_BYTES); retry shortly",
            code="too_busy",
        )
        err.retry_after = 1.0
        return err

    def _team_too_busy(self, team: str) -> RateLimited:
        err = RateLimited(
            f"the bodies of team {team}'s requests in progress already take "
            f"{self.team_buffered.get(team, 0)} bytes (at most {self.max_team_buffered_bytes}, "
            f"{self.prefix}MAX_TEAM_BUFFERED_BYTES); retry shortly",
            code="too_busy",
        )
        err.retry_after = 1.0
        return err

    def _over_budget(self, team: str | None, more: int) -> RateLimited | None:
        """429 if ``more`` bytes would pass the global or the team's budget."""
        if self.buffered + more > self.max_buffered_bytes:
            return self._too_busy()
        if team is None or self.team_buffered.get(team, 0) + more <= self.max_team_buffered_bytes:
            return None
        return self._team_too_busy(team)

    def _too_slow(self) -> BadRequest:
        return BadRequest(
            f"the body did not arrive within {self.body_timeout_s:g} s "
            f"({self.prefix}BODY_TIMEOUT_S); send it at once, or split the request",
            code="body_timeout",
            status=408,
        )

    def _too_large(self, size: str) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"the body is {size} bytes, more than {self.max_body_bytes} ({self.setting}); "
            "split the request",
            code="body_too_large",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        length = headers.get(b"content-length", b"")
        # an empty body has no media type to refuse: aiohttp labels a bodiless POST (ORS's
        # /ping, /delete) application/octet-stream
        if content_type and not is_json_type(content_type) and length != b"0":
            await _refuse(
                scope,
                send,
                UnsupportedMediaType(
                    f"Content-Type {content_type!r} is not JSON; send application/json",
                    code="unsupported_media_type",
                ),
            )
            return
        if length.isdigit() and int(length) > self.max_body_bytes:
            await _refuse(scope, send, self._too_large(length.decode()))
            return
        team = scope.get("state", {}).get("team")
        busy = self._over_budget(team, int(length)) if length.isdigit() else None
        if busy is not None:
            await _refuse(scope, send, busy)
            return
        chunks: list[bytes] = []
        size = 0  # this body's bytes, all held against the budgets until it is done
        try:
            refusal: ArbiterError | None = None
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    while True:
                        message = await receive()
                        if message["type"] != "http.request":  # the client left while sending
                            await self.app(scope, disconnected, send)  # routed: a 499
                            return
                        chunk = message.get("body", b"")
                        if size + len(chunk) > self.max_body_bytes:
                            refusal = self._too_large(f"over {self.max_body_bytes}")
                            break
                        refusal = self._over_budget(team, len(chunk))
                        if refusal is not None:
                            break
                        size += len(chunk)
                        self.buffered += len(chunk)
                        if team is not None:
                            self.team_buffered[team] = self.team_buffered.get(team, 0) + len(chunk)
                        chunks.append(chunk)
                        if not message.get("more_body", False):
                            break
            except TimeoutError:
                refusal = self._too_slow()
            if refusal is not None:
                await _refuse(scope, send, refusal)
                return
            body = b"".join(chunks)
            del chunks
            where = lone_surrogate(body)
            if where is not None:
                await _refuse(scope, send, invalid_unicode(where))
                return
            await self._run(scope, receive, send, body)
        finally:
            self.buffered -= size
            if team is not None and size:
                left = self.team_buffered.get(team, 0) - size
                if left > 0:
                    self.team_buffered[team] = left
                else:
                    self.team_buffered.pop(team, None)

    async def _run(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnects reach the route

        token = REQUEST_LIMITS.set(self.limits)
        try:
            await self.app(scope, replay, send)
        finally:
            REQUEST_LIMITS.reset(token)


def invalid_unicode(param: str) -> Unprocessable:
    return Unprocessable(
        f"{param}: the string holds a lone UTF-16 surrogate (e.g. \\ud800), which is not "
        "valid Unicode",
        param=param,
        code="invalid_unicode",
    )


def unreadable_body(cause: BaseException | None) -> BadRequest:
    """400 ``invalid_json`` for a body the JSON parser gave up on for a reason other than
    its syntax: bytes that are not UTF-8, or nesting deeper than the parser's stack."""
    if isinstance(cause, RecursionError):
        reason = "it is nested too deeply to parse"
    elif isinstance(cause, UnicodeDecodeError):
        reason = f"it is not UTF-8 ({cause.reason} at byte {cause.start})"
    else:
        reason = f"{type(cause).__name__}: {cause}" if cause else "it could not be parsed"
    return BadRequest(f"the body is not valid JSON: {reason}", code="invalid_json")


async def _refuse(scope: Scope, send: Send, exc: ArbiterError) -> None:
    """Answer ``exc`` in the one envelope without calling the app."""
    body = clean_envelope(exc.envelope()).model_dump_json().encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in exc.headers.items()),
    ]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
