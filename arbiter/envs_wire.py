"""The environments client's wire: the gateway's ORS answers and Arbiter's batch answers,
parsed (``arbiter.envs`` is the client that sends the requests).

A tool call's answer is ORS's SSE stream: ``task_id``, keep-alive comments, the result in
``chunk``/``end`` events; a call that did not answer ends without ``end``, its
``: arbiter-error`` comment saying why (``stream_error``).
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from arbiter.errors import (
    MAX_MESSAGE_CHARS,
    ArbiterError,
    BadResponse,
    Unavailable,
    Unprocessable,
    from_response,
)
from arbiter.proto.envs import (
    ERROR_COMMENT,
    BatchCalled,
    BatchCallResult,
    BatchCreated,
    BatchDeleted,
    BatchOpened,
    ListToolsOutput,
    RunToolError,
    RunToolSuccess,
    TasksOutput,
    ToolOutput,
)
from arbiter.proto.errors import ErrorResponse

_RESULT: TypeAdapter[RunToolSuccess | RunToolError] = TypeAdapter(RunToolSuccess | RunToolError)

TOOLS = TypeAdapter(ListToolsOutput)
TASKS = TypeAdapter(TasksOutput)
CREATED = TypeAdapter(BatchCreated)
CALLED = TypeAdapter(BatchCalled)
DELETED = TypeAdapter(BatchDeleted)
# a batch's tool call: (sid, env_name, tool, its input)
BatchItem = tuple[str, str, str, dict[str, Any]]
T = TypeVar("T")


class ToolRefused(Unprocessable):
    """The environment refused a tool call (ORS ``ok: false``); ``code`` is its reason."""


def idem() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


def check(r: httpx.Response) -> httpx.Response:
    if r.status_code != 200:
        raise from_response(r.status_code, r.content, source="envs")
    return r


def parse(adapter: TypeAdapter[T], r: httpx.Response) -> T:
    try:
        return adapter.validate_json(check(r).content)
    except ValidationError as exc:
        where = f"HTTP 200 from {r.request.url}"
        raise BadResponse(f"{where}: not the ORS answer: {exc}"[:MAX_MESSAGE_CHARS]) from exc


def sse_events(text: str) -> list[tuple[str, str]]:
    """The (event, data) pairs of an SSE body, in order (comments and ids skipped)."""
    out: list[tuple[str, str]] = []
    event, lines = "", []
    for line in [*text.splitlines(), ""]:
        if line:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                lines.append(value)
            continue
        if event or lines:
            out.append((event or "message", "\n".join(lines)))
        event, lines = "", []
    return out


def new_sid(r: httpx.Response) -> str:
    """The session id of ``POST /create_session``'s answer (ORS: its ``task_id`` event)."""
    for event, data in sse_events(check(r).text):
        if event == "task_id" and data.strip():
            return data.strip()
    raise BadResponse(f"{r.request.url}: no task_id event with the session id")


def tool_output(r: httpx.Response) -> ToolOutput:
    """A tool call's ORS SSE body as its ``ToolOutput`` (see the module docstring)."""
    data: list[str] = []
    for event, value in sse_events(check(r).text):
        if event == "error":
            raise Unavailable(f"the environment failed: {value}"[:MAX_MESSAGE_CHARS])
        if event in ("chunk", "end"):
            data.append(value)
        if event == "end":
            break
    else:
        raise stream_error(r)
    try:
        result = _RESULT.validate_json("".join(data))
    except ValidationError as exc:
        raise BadResponse(f"{r.request.url}: not a ToolOutput: {exc}"[:MAX_MESSAGE_CHARS]) from exc
    if isinstance(result, RunToolError):
        raise ToolRefused(result.error, code=result.reason or "tool_refused")
    return result.output


def stream_error(r: httpx.Response) -> ArbiterError:
    """Why a tool call's stream ended without its result: the error its ``: arbiter-error``
    comment reports (503 or 504: retryable; the call did not take effect), else a
    ``BadResponse``."""
    for line in r.text.splitlines():
        if line.startswith(ERROR_COMMENT):
            status, _, envelope = line.removeprefix(ERROR_COMMENT).partition(" ")
            return from_response(int(status), envelope, source=str(r.request.url))
    return BadResponse(f"{r.request.url}: the SSE body has no end event")


def create_body(
    env: str, task_spec: dict[str, Any] | None, split: str | None, index: int | None
) -> dict[str, Any]:
    if (task_spec is None) == (split is None or index is None):
        raise ValueError("give either task_spec, or split and index")
    if task_spec is not None:
        return {"env_name": env, "task_spec": task_spec}
    return {"env_name": env, "split": split, "index": index}


def _failed(status: int, error: Any) -> ArbiterError:
    return from_response(status, ErrorResponse(error=error).model_dump_json(), source="envs")


def opened(item: BatchOpened) -> str | ArbiterError:
    if item.sid is not None:
        return item.sid
    if item.failed is None:
        return BadResponse("a batch item with neither sid nor failed")
    return _failed(item.failed.status, item.failed.error)


def called(item: BatchCallResult) -> ToolOutput | ArbiterError:
    """One item of a batch's answer as ``Session.call`` returns or raises it."""
    if item.failed is not None:
        return _failed(item.failed.status, item.failed.error)
    if isinstance(item.result, RunToolError):
        return ToolRefused(item.result.error, code=item.result.reason or "tool_refused")
    if item.result is None:
        return BadResponse("a batch item with neither result nor failed")
    return item.result.output


def batch_body(op: str, items: list[Any], env: str = "") -> dict[str, Any]:
    if op == "create":
        return {"episodes": [{"env_name": env, "task_spec": spec} for spec in items]}
    if op == "call":
        return {"calls": [{"sid": s, "env_name": e, "name": n, "input": a} for s, e, n, a in items]}
    return {"sids": items}
