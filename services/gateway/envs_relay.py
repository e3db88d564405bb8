"""A tool call's SSE stream from the envs service to the caller, and the failures of the
path to the envs service: the part of ``envs_proxy.EnvsProxy`` that reads what it relays.

The envs service streams ORS's events (``task_id``, keep-alive comments, ``chunk``/``end``
or ``error``) and two comments of Arbiter's (``proto.envs``): ``: arbiter-usage`` (what
the run cost) and ``: arbiter-error`` (the status and envelope of a call that did not
answer). ``relay`` passes every block on as it comes but the usage, which settles the call.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp
from prometheus_client import Counter
from starlette.responses import Response

from arbiter.errors import (
    ArbiterError,
    BadResponse,
    Timeout,
    Unavailable,
    from_response,
    to_envelope,
)
from arbiter.proto.envs import ERROR_COMMENT, USAGE_COMMENT
from arbiter.services.common.throttle import ThrottledLog

log = logging.getLogger("arbiter.gateway.envs")
FAILURES_LOG = ThrottledLog(log)
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # an episode's answers are small; past this, a fault
USAGE_LINE = USAGE_COMMENT.encode()

ENVS_CALLS = Counter(
    "arbiter_gateway_envs_calls_total",
    "Calls forwarded to the envs service, by kind (tool, other, discovery) and outcome "
    "(the envs service's HTTP status, or unavailable / timeout).",
    ["kind", "outcome"],
)
# (usage: (tool calls, CPU ms), or None for a stream cut short; what to store for an
# Idempotency-Key: its content type, then the stream, or None when it did not end)
Settle = Callable[[tuple[int, int] | None, list[bytes] | None], Awaitable[None]]


def late(timeout_s: float) -> Timeout:
    return Timeout(
        f"the envs service did not answer within {timeout_s:g} s (GATEWAY_ENVS_TIMEOUT_S); retry",
        code="envs_timeout",
    )


def unreachable(exc: BaseException) -> Unavailable:
    return Unavailable(
        f"the envs service is unreachable ({type(exc).__name__}); retry", code="envs_unavailable"
    )


def read_usage(value: str) -> tuple[int, int]:
    """(tool calls, sandbox CPU ms) of the envs service's ``: arbiter-usage`` comment; (0, 0)
    for one that is not the contract (logged: the call is not charged twice)."""
    try:
        doc = json.loads(value)
        calls, cpu = int(doc.get("tool_calls", 0)), int(doc.get("sandbox_cpu_ms", 0))
    except (ValueError, TypeError, AttributeError):
        FAILURES_LOG.warning("usage", "envs: %s is not the contract: %.200r", USAGE_COMMENT, value)
        return 0, 0
    return max(0, calls), max(0, cpu)


async def relay(
    resp: aiohttp.ClientResponse, timeout_s: float, settle: Settle
) -> AsyncIterator[bytes]:
    """The call's SSE, block by block as the envs service sends it, less its usage comment;
    ``settle`` at the end, whatever ended it. A stream cut short (the caller gone, the envs
    service down or past ``timeout_s``) ends with an ``: arbiter-error`` of its own, and no
    ``end``: an ORS client resumes it with its ``task_id``, and that stream carries the
    cost."""
    usage: tuple[int, int] | None = None
    kept = [resp.headers.get("content-type", "text/event-stream").encode("latin-1") + b"\n"]
    size, ended = 0, False
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        block: list[bytes] = []
        try:
            while True:
                async with asyncio.timeout_at(deadline):
                    line = await resp.content.readline()
                if not line:
                    break
                block.append(line)
                size += len(line)
                if size > MAX_ANSWER_BYTES:
                    raise BadResponse(f"the envs service sent more than {MAX_ANSWER_BYTES} B")
                if line.strip(b"\r\n"):
                    continue
                data, block = b"".join(block), []
                if data.startswith(USAGE_LINE):
                    usage = read_usage(data[len(USAGE_LINE) :].decode("utf-8", "replace"))
                    continue
                ended = ended or data.startswith(b"event: end")
                kept.append(data)
                yield data
        except TimeoutError:
            ENVS_CALLS.labels("tool", "timeout").inc()
            yield error_comment(late(timeout_s))
        except (aiohttp.ClientError, BadResponse) as exc:
            ENVS_CALLS.labels("tool", "unavailable").inc()
            FAILURES_LOG.warning("stream", "envs: a tool call's stream broke: %s", exc)
            yield error_comment(unreachable(exc))
    finally:
        await asyncio.shield(settle(usage, kept if ended else None))


def error_comment(exc: ArbiterError) -> bytes:
    """A failure of the relay itself, as the envs service reports one in its stream."""
    status, body = to_envelope(exc)
    return f"{ERROR_COMMENT}{status} {body.model_dump_json()}\n\n".encode()


def whole(body: bytes, headers: Mapping[str, str]) -> Response:
    """A tool call's stream, whole: as it is when it ended with its result; else the
    error it reported (its ``: arbiter-error`` comment), raised."""
    text = body.decode("utf-8", "replace")
    if "\nevent: end\n" in f"\n{text}":
        return Response(body, status_code=200, headers=dict(headers))
    for line in text.splitlines():
        if line.startswith(ERROR_COMMENT):
            status, _, envelope = line.removeprefix(ERROR_COMMENT).partition(" ")
            raise from_response(int(status), envelope)
    raise Unavailable("the envs service's stream ended before its answer; retry")
