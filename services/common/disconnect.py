"""Work leaves with its client: a request whose client disconnects is cancelled.

uvicorn does not cancel a route when its client goes away; it only answers the next
``receive()`` with ``http.disconnect``. So once the app has read the whole body, this
middleware listens on ``receive`` itself and, on ``http.disconnect`` before the response
is complete, cancels the task that runs the request. The cancellation runs down every
``await`` of the route: the gateway's component calls (their connections close, so each
component service sees its own client leave), a verify request's queued pool items, the
embedding batcher's queued texts, the judge's waiting and running calls.

The cancelled request is recorded with status 499 (nginx's "client closed request") and
nothing is sent: there is nobody to read it. ``CANCELLED`` counts them.
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

        async def watch() -> None:
            nonlocal cancelled
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            if not complete:
                cancelled = True
                task.cancel()

        async def receive_wrapper() -> Message:
            nonlocal watcher
            if watcher is not None:  # the body is read; only a disconnect can come now
                await gone.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                watcher = asyncio.create_task(watch())
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
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
