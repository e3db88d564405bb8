"""The environments as NeMo Gym resources servers: ``/nemo-gym/envs/{env_name}/...``.

NeMo Gym's agents (``responses_api_agents/simple_agent``) drive a resources server with
cookies: ``POST /seed_session`` with the dataset row, then ``POST /{tool}`` with a function
call's arguments for each call the model makes (the answer's text is the tool's output the
model sees, errors included), then ``POST /verify`` with the row and the Responses-API
``response`` (the request echoed with ``reward``); each call carries the cookies of the
previous answer. Here each route is the ORS call of the same episode, through
``envs_proxy.EnvsProxy`` (key, quota, ``Idempotency-Key``, ledger, fair share):

- ``seed_session``: ``create_session`` + ``create``; the task is the row's ``task_spec``
  object, else the row's own task fields (``question`` and ``answer`` or
  ``expected_answer``; ``prompt``, ``entry_point``, ``tests``, ``hidden_tests``), else
  ``split`` and ``index``. The ORS session id is the ``arbiter_env_session`` cookie. A typed
  seed (an Environment Server's ``ResourcesSeedSessionRequest``: ``resources_session_id``,
  ``episode_id``, ``task_id``, the row as ``task_data``) answers its id back, and is
  idempotent: its episode's sid is derived from the id (``nemo_sessions``).
- ``/{tool}``: the ORS tool call; answered with its result as JSON (``{"ok": true,
  "output": ToolOutput}`` or ``{"ok": false, "error", "reason"}``).
- ``verify``: the episode's reward. If a tool call finished the episode, its output
  (remembered in the state Redis for a day, else in this process); otherwise the
  response's final text is submitted with the environment's ``submit`` tool. A reward that
  could not be computed is ``mask_sample: true`` with ``failure_kind`` and
  ``failure_reason`` (NeMo Gym's vocabulary), never a silent 0.
- ``close_session``: ``delete``; typed (``ResourcesCloseSessionRequest``), it answers the id
  back whether the session is open, closed or was never seeded, and the id stays closed: a
  seed after it is 409 ``session_closed``, as NeMo Gym's session checker requires of a
  server that keeps state.
- ``aggregate_metrics``: NeMo Gym's default aggregation of a run's verify responses
  (``nemo_metrics``); ``reverify_mode``: ``unsupported``, since a reward is the episode's.

NeMo Gym reaches a server by host and port only, so a resources server of a few lines
forwards these routes to the gateway (docs/services/environments.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Cookie, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from arbiter.envs_wire import sse_events
from arbiter.errors import ArbiterError, BadRequest, BadResponse, from_response
from arbiter.keys import Principal
from arbiter.proto.compat import NemoGymVerifyRequest, NemoGymVerifyResponse
from arbiter.proto.envs import SESSION_HEADER
from arbiter.proto.nemo_gym import (
    NemoGymAggregateMetrics,
    NemoGymAggregateMetricsRequest,
    NemoGymCloseSession,
    NemoGymCloseSessionResponse,
    NemoGymSeedSession,
    NemoGymSeedSessionResponse,
    ReverifyMode,
)
from arbiter.services.common.app import ERROR_RESPONSES
from arbiter.services.common.responses import JSONBody
from arbiter.services.gateway.auth import principal
from arbiter.services.gateway.compat import NEMO_GYM_KINDS
from arbiter.services.gateway.compat_text import nemo_gym_texts
from arbiter.services.gateway.envs_proxy import EnvsProxy
from arbiter.services.gateway.nemo_metrics import aggregate
from arbiter.services.gateway.nemo_sessions import Done, Sessions, closed_error, sid_of
from arbiter.services.gateway.routes import AUTH_RESPONSES

COOKIE = "arbiter_env_session"
TASK_FIELDS = ("question", "answer", "id", "prompt", "entry_point", "tests", "hidden_tests")
JSON = {"content-type": "application/json"}

router = APIRouter(
    prefix="/nemo-gym/envs", tags=["environments (NeMo Gym)"], responses=ERROR_RESPONSES
)
SessionCookie = Annotated[str | None, Cookie(alias=COOKIE, description="From seed_session.")]
SeedBody = Annotated[
    NemoGymSeedSession | dict[str, Any],
    Body(description="An Environment Server's typed seed, or the dataset row (an agent's)."),
]
CloseBody = Annotated[
    NemoGymCloseSession | dict[str, Any] | None,
    Body(description="An Environment Server's typed close; without it, the cookie's episode."),
]
Args = Annotated[dict[str, Any], Body(description="The function call's arguments.")]
THREAD_RESPONSES = 512  # aggregate this many verify responses or more off the event loop
M = TypeVar("M", bound=BaseModel)


def task_of(row: dict[str, Any]) -> dict[str, Any]:
    """ORS ``/create``'s body fields for a NeMo Gym dataset row (the module docstring)."""
    if isinstance(row.get("task_spec"), dict):
        return {"task_spec": row["task_spec"]}
    spec = {k: row[k] for k in TASK_FIELDS if k in row}
    if "answer" not in spec and "expected_answer" in row:
        spec["answer"] = row["expected_answer"]
    if spec:
        return {"task_spec": spec}
    if "split" in row and "index" in row:
        return {"split": row["split"], "index": row["index"]}
    raise BadRequest(
        "task_spec: the row names no task; give task_spec, its fields (question and "
        "expected_answer, ...), or split and index",
        param="task_spec",
    )


async def _post(
    request: Request, who: Principal, path: str, body: Any, sid: str | None = None
) -> Response:
    proxy: EnvsProxy = request.app.state.envs
    headers = dict(JSON)
    if sid is not None:
        headers[SESSION_HEADER] = sid
    data = b"" if body is None else json.dumps(body).encode()
    answer = await proxy.forward(who, "POST", path, data, headers)
    if answer.status_code != 200:
        raise from_response(answer.status_code, bytes(answer.body), source="envs")
    return answer


def _end(answer: Response) -> dict[str, Any]:
    """The JSON of an ORS SSE body (its ``chunk`` and ``end`` events)."""
    events = sse_events(bytes(answer.body).decode())
    if any(e == "error" for e, _ in events):
        raise BadResponse(
            "the environment failed: " + "; ".join(d for e, d in events if e == "error")
        )
    out: dict[str, Any] = json.loads("".join(d for e, d in events if e in ("chunk", "end")))
    return out


def _need(sid: str | None) -> str:
    if not sid:
        raise BadRequest(
            f"{COOKIE}: no session cookie; call seed_session first and send its cookies",
            param=COOKIE,
        )
    return sid


def _typed(model: type[M], body: M | dict[str, Any] | None) -> M | None:
    """The body as NeMo Gym's typed ``model`` when it names a ``resources_session_id``
    (422 naming the bad field when it is not one), else None: a legacy body."""
    if isinstance(body, model):
        return body
    if not isinstance(body, dict) or "resources_session_id" not in body:
        return None
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        ) from None


@router.post(
    "/{env_name}/seed_session",
    response_model=NemoGymSeedSessionResponse | dict[str, Any],
    responses=AUTH_RESPONSES,
    summary="NeMo Gym: start",
)
async def seed_session(env_name: str, request: Request, body: SeedBody) -> Response:
    who = principal(request)
    seed = _typed(NemoGymSeedSession, body)
    if seed is None:  # an agent's: the row, a new episode, {} with its cookie
        assert isinstance(body, dict)
        created = await _post(request, who, "create_session", None)
        events = sse_events(bytes(created.body).decode())
        sid = next((d.strip() for e, d in events if e == "task_id"), "")
        if not sid:
            raise BadResponse("the envs service answered create_session without a session id")
        await _post(request, who, "create", {"env_name": env_name, **task_of(body)}, sid)
        answer = JSONBody(b"{}")
    else:
        sid = await _seed_typed(request, who, env_name, seed)
        rsid = seed.resources_session_id
        answer = JSONBody(NemoGymSeedSessionResponse(resources_session_id=rsid))
    answer.set_cookie(COOKIE, sid, httponly=True, samesite="strict")
    return answer


async def _seed_typed(
    request: Request, who: Principal, env_name: str, seed: NemoGymSeedSession
) -> str:
    """The episode of a typed seed, opened once however often it is seeded; its sid."""
    create = {"env_name": env_name, **task_of(seed.task_data)}
    sessions = Sessions(request, who.team)
    await sessions.seed(env_name, seed)  # 409 when closed or seeded for another episode
    sid = sid_of(seed.resources_session_id)
    try:
        await _post(request, who, "create", create, sid)
    except BadRequest as exc:
        if exc.code != "session_exists":  # else this seed's episode is open already
            raise
    if await sessions.is_closed(seed.resources_session_id):
        # closed while it opened: the close's delete may have come first, so delete again
        with contextlib.suppress(ArbiterError):  # else it expires with its idle TTL
            await _post(request, who, "delete", None, sid)
        raise closed_error(seed.resources_session_id)
    return sid


@router.post("/{env_name}/verify", responses=AUTH_RESPONSES, summary="NeMo Gym: the reward")
async def verify(
    env_name: str, request: Request, body: NemoGymVerifyRequest, sid: SessionCookie = None
) -> JSONBody:
    who = principal(request)
    sid = _need(sid)
    done = Done(request, who.team, sid)
    stored = await done.get()
    if stored is not None:
        output = json.loads(stored)
    else:
        (_, _, text), _ = nemo_gym_texts(body, None)
        field = await _submit_field(request, env_name)
        call = {"name": "submit", "input": {field: text}}
        result = _end(await _post(request, who, f"{env_name}/call", call, sid))
        if not result.get("ok"):
            raise BadRequest(f"submit: {result.get('error')}", param="response")
        output = result["output"]
    await done.forget()
    with contextlib.suppress(ArbiterError):  # else it expires with its idle TTL
        await request.app.state.envs.forward(who, "POST", "delete", b"", {SESSION_HEADER: sid})
    return JSONBody(verified(body, output))


def verified(body: NemoGymVerifyRequest, output: dict[str, Any]) -> NemoGymVerifyResponse:
    """NeMo Gym's verify answer for an episode's final ``ToolOutput``."""
    meta = output.get("metadata") or {}
    comps = {k: float(v) for k, v in (meta.get("components") or {}).items() if v is not None}
    errors = meta.get("errors") or []
    reward = output.get("reward")
    kind = reason = None
    if errors:
        kind = NEMO_GYM_KINDS.get(errors[0]["kind"], f"arbiter:{errors[0]['kind']}")
        reason = "; ".join(f"{e.get('component')}: {e.get('message')}" for e in errors)[:2000]
    return NemoGymVerifyResponse.model_validate(
        {
            **body.model_dump(),
            **comps,
            "reward": reward if reward is not None else 0.0,
            "reward_components": comps,
            "mask_sample": reward is None,
            "failure_kind": kind,
            "failure_reason": reason,
        }
    )


async def _submit_field(request: Request, env_name: str) -> str:
    """The name of the ``submit`` tool's input (``answer``, or ``code`` for code)."""
    proxy: EnvsProxy = request.app.state.envs
    answer = await proxy.forward(None, "GET", f"{env_name}/tools", b"", {})
    if answer.status_code != 200:
        raise from_response(answer.status_code, bytes(answer.body), source="envs")
    for tool in json.loads(bytes(answer.body))["tools"]:
        if tool["name"] == "submit":
            required = (tool.get("input_schema") or {}).get("required") or ["answer"]
            return str(required[0])
    raise BadRequest(f"env_name: {env_name} has no submit tool", param="env_name")


@router.post(
    "/{env_name}/close_session",
    response_model=NemoGymCloseSessionResponse | dict[str, Any],
    responses=AUTH_RESPONSES,
    summary="NeMo Gym: end",
)
async def close_session(
    env_name: str, request: Request, body: CloseBody = None, sid: SessionCookie = None
) -> JSONBody:
    who = principal(request)
    close = _typed(NemoGymCloseSession, body)
    if close is not None:  # closed first, so a seed racing this close finds it closed
        await Sessions(request, who.team).close(close.resources_session_id, close.episode_id)
        sid = sid_of(close.resources_session_id)
    sid = _need(sid)
    await Done(request, who.team, sid).forget()
    await _post(request, who, "delete", None, sid)  # fails (retry the close) or deleted
    if close is None:
        return JSONBody(b"{}")
    return JSONBody(NemoGymCloseSessionResponse(resources_session_id=close.resources_session_id))


@router.post(
    "/{env_name}/aggregate_metrics",
    response_model=NemoGymAggregateMetrics,
    responses=AUTH_RESPONSES,
    summary="NeMo Gym: a run's metrics",
)
async def aggregate_metrics(
    env_name: str, request: Request, body: NemoGymAggregateMetricsRequest
) -> JSONBody:
    """NeMo Gym's default aggregation of the run's verify responses (``nemo_metrics``)."""
    principal(request)
    responses = body.verify_responses
    if len(responses) < THREAD_RESPONSES:
        return JSONBody(aggregate(responses))
    return JSONBody(await asyncio.to_thread(aggregate, responses))


@router.get(
    "/{env_name}/reverify_mode",
    response_model=ReverifyMode,
    responses=AUTH_RESPONSES,
    summary="NeMo Gym: can verify run again",
)
async def reverify_mode(env_name: str) -> JSONBody:
    """``unsupported``: a reward is its episode's (a submit call may have finished it), so a
    saved rollout's verify request alone cannot score it again."""
    return JSONBody(json.dumps(ReverifyMode.UNSUPPORTED.value).encode())


@router.post("/{env_name}/{tool}", responses=AUTH_RESPONSES, summary="NeMo Gym: a tool call")
async def tool_call(
    env_name: str, tool: str, request: Request, args: Args, sid: SessionCookie = None
) -> JSONBody:
    who = principal(request)
    sid = _need(sid)
    key = request.headers.get("Idempotency-Key")
    proxy: EnvsProxy = request.app.state.envs
    call = json.dumps({"name": tool, "input": args}).encode()
    headers = {**JSON, SESSION_HEADER: sid}
    answer = await proxy.forward(who, "POST", f"{env_name}/call", call, headers, key)
    if answer.status_code != 200:
        raise from_response(answer.status_code, bytes(answer.body), source="envs")
    result = _end(answer)
    if result.get("ok") and result["output"].get("finished"):
        await Done(request, who.team, sid).put(json.dumps(result["output"]).encode())
    return JSONBody(json.dumps(result).encode())
