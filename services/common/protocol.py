"""uvicorn's answer to a request it cannot parse, in the one error envelope.

A request whose head is not valid HTTP/1.1 (a NUL or DEL byte, or another control
character, in a header name or value; a malformed request line) never reaches the app:
the server's parser (httptools, or h11 without it) refuses it, and uvicorn answers a
plain-text ``400 Invalid HTTP request received.`` from its protocol class and closes the
connection. ``arbiter serve`` runs uvicorn with the protocol classes below instead
(``uvicorn.Config(http=...)`` takes a class), which answer the same 400 with the envelope,
``code: "invalid_http"``. What still cannot be answered this way (docs/operations/errors.md):
bytes that do not start an HTTP request at all, a client that closes mid-head, and uvicorn's
own 503 past ``--limit-concurrency`` (not set by Arbiter).

``send_400_response`` is the one method overridden; uvicorn has called it for a parser
error since 0.11 (h11 and httptools alike). ``tests/services/common/test_protocol.py``
checks the answer on a real server, so an upgrade that changes this fails there. The
protocol's warnings (one "Invalid HTTP request received." per malformed request, which a
client can send in a loop) are throttled: one line per message per 10 s, with a count.

A connection must also send a complete request head within ``HEAD_TIMEOUT_S`` of opening,
and of each answer on it; else it is closed, without an answer (``_HeadDeadline``).
uvicorn has no such deadline (its keep-alive timer stops at the first byte): without
this one, a connection sending nothing, or a head a byte at a time, is held for as long
as the client likes, and 19,980 of them, without a key, fill the gateway's 20,000 file
descriptors in 5 s.
A request being served is never cut by it (the body has its own deadline,
``<PREFIX>_BODY_TIMEOUT_S``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from arbiter.errors import BadRequest
from arbiter.services.common.echo import clean_envelope
from arbiter.services.common.throttle import ThrottledLog

MESSAGE = (
    "the request is not valid HTTP/1.1: a header name or value holds a byte HTTP does not "
    "allow (NUL, DEL or another control character), or the request line is malformed"
)
BODY = clean_envelope(BadRequest(MESSAGE, code="invalid_http").envelope()).model_dump_json()
_BODY = BODY.encode()
_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(_BODY)).encode()),
    (b"connection", b"close"),
]


class _ThrottledWarnings:
    """uvicorn's protocol logger with its warnings throttled per message; the rest as is."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._throttled = ThrottledLog(logger)

    def warning(self, msg: str, *args: object, **_: Any) -> None:
        self._throttled.warning(msg, msg, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


_LOGGER: Any = _ThrottledWarnings(logging.getLogger("uvicorn.error"))

# Seconds a connection has to send a complete request head (read when each deadline is set).
HEAD_TIMEOUT_S = 10.0


class _HeadDeadline:
    """The head deadline, on uvicorn's protocol classes: set when the connection opens and
    after each answer; when it passes, a connection with no request being served is closed
    (one served since has set it again when answered). A pipelined or kept-alive request
    whose head came in time is never cut."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    _head_timer: asyncio.TimerHandle | None = None

    def _set_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being served: its answer sets the deadline again
        if not self.transport.is_closing():
            _LOGGER.warning("Connection closed: no complete request head in time.")
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._set_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._set_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)  # type: ignore[misc]


class EnvelopeH11Protocol(_HeadDeadline, H11Protocol):
    """uvicorn's h11 protocol; a request it cannot parse gets the envelope; a head deadline."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = _LOGGER

    def send_400_response(self, msg: str) -> None:
        for event in (
            h11.Response(status_code=400, headers=_HEADERS, reason=b"Bad Request"),
            h11.Data(data=_BODY),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()


HTTPProtocol: type[asyncio.Protocol] = EnvelopeH11Protocol
try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is not installed: uvicorn's "auto" picks h11 too
    pass
else:

    class EnvelopeHttpToolsProtocol(_HeadDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol; a request it cannot parse gets the envelope; a head
        deadline."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.logger = _LOGGER

        def send_400_response(self, msg: str) -> None:
            content = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in [*self.server_state.default_headers, *_HEADERS]:
                content.extend([name, b": ", value, b"\r\n"])
            content.extend([b"\r\n", _BODY])
            self.transport.write(b"".join(content))
            self.transport.close()

    HTTPProtocol = EnvelopeHttpToolsProtocol
