"""Work leaves with its client: a request whose client disconnects is cancelled.

uvicorn does not cancel a route when its client goes away; it only answers the next
``receive()`` with ``http.disconnect``. So once the app has read the whole body (and the
request is still running 50 ms later), this middleware listens on ``receive`` itself and,
on ``http.disconnect`` before the response is complete, cancels the task that runs the
request. The cancellation runs down every
``await`` of the route: the gateway's component calls (their connections close, so each
component service sees its own client leave), a verify request's queued pool items, the
embedding batcher's queued texts, the judge's waiting and running calls.

The cancelled request is recorded with status 499 (nginx's "client closed request") and
nothing is sent: there is nobody to read it. ``CANCELLED`` counts them. A client that
leaves while it is still sending the body is recorded the same way: the limits middleware
routes the request as usual with ``disconnected`` as its ``receive``, the route's body read
raises starlette's ``ClientDisconnect``, and the app's handler answers 499 (to nobody)
under the route it was sent to. A client's choice is never a 5xx; the timing middleware
logs each 499 at info with its route.
"""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CANCELLED = Counter(
    "arbiter_http_cancelled_total",
    "Requests cancelled because their client disconnected before the answer.",
    ["service"],
)
CLIENT_CLOSED = 499
# Listening starts this long after the body is read: a request answered sooner (most of
# them) costs a timer, not a task; a client that leaves is noticed this much later at most.
WATCH_AFTER_S = 0.05


def route_path(scope: Scope) -> str:
    """The route template a request was routed to (``/v1/score``), else ``unmatched``."""
    return str(getattr(scope.get("route"), "path", "unmatched"))


async def disconnected() -> Message:
    """A ``receive`` for a request whose client has left."""
    return {"type": "http.disconnect"}


class CancelOnDisconnect:
    """Pure ASGI middleware: cancel the request's task when its client disconnects."""

    def __init__(self, app: ASGIApp, service: str) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        gone = asyncio.Event()
        complete = False  # the response's last byte is sent: a disconnect now is normal
        cancelled = False
        watcher: asyncio.Task[None] | None = None
        later: asyncio.TimerHandle | None = None
        loop = asyncio.get_running_loop()

        async def watch() -> None:
            nonlocal cancelled
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            if not complete:
                cancelled = True
                task.cancel()

        def start_watching() -> None:
            nonlocal watcher
            if not complete:
                watcher = asyncio.create_task(watch())

        async def receive_wrapper() -> Message:
            nonlocal later
            if later is not None:  # the body is read; only a disconnect can come now
                await gone.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                # Most requests are answered within moments: they never pay for a task.
                later = loop.call_later(WATCH_AFTER_S, start_watching)
            return message

        async def send_wrapper(message: Message) -> None:
            nonlocal complete
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        except asyncio.CancelledError:
            if not cancelled:
                raise  # the server is shutting down, not our doing
            task.uncancel()
            CANCELLED.labels(self.service).inc()
            # recorded by the timing middleware; uvicorn drops it (the client is gone)
            await send({"type": "http.response.start", "status": CLIENT_CLOSED, "headers": []})
        finally:
            complete = True
            if later is not None:
                later.cancel()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
