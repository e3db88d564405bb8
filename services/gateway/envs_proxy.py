"""Calls to the envs service on a team's behalf: the work behind ``/ors`` and
``/nemo-gym/envs`` (``ors.py``, ``nemo_envs.py``), importable without FastAPI.

``EnvsProxy.forward`` takes an authenticated call (``who``; None for the ORS discovery
routes, which need no key and carry no team) and, in this order:

1. ``Idempotency-Key`` on a POST (``idempotency.py``): the stored answer of an earlier call
   with the key (the same path, ``X-Session-ID`` and body) is answered again, byte for
   byte, with its content type (``Idempotent-Replayed: true``; not forwarded, not counted
   again); a new key is claimed.
2. quota (``envs_quota.py``): a tool call (``POST /{env}/call``) or an episode opened
   (``POST /create``) takes one from the team's tool-call bucket, and passes only while
   its sandbox-CPU bucket is above zero (429).
3. the call goes to ``GATEWAY_ENVS_URL`` with the team in ``X-Arbiter-Team`` (the envs
   service keeps each team's sessions apart by it) within the team's fair share of
   ``GATEWAY_MAX_CONCURRENCY`` slots (``slots.TeamSlots``) and ``GATEWAY_ENVS_TIMEOUT_S``.
   Its answer is relayed byte for byte (status, content type, body: the ORS SSE body of a
   tool call is small and complete once the tool has run).
4. settlement: the sandbox CPU the envs service reports in ``X-Arbiter-Usage`` (JSON,
   ``{"tool_calls": 1, "sandbox_cpu_ms": N}``; never relayed) is charged to the quota and
   recorded in the usage ledger (``env_tool_calls``, ``sandbox_cpu_ms``); a tool call that
   did not run (the service was unreachable, or refused it), or a ``/create`` not answered
   200, gets its call back; a 200 answer is stored for its key, any other releases the key
   so a retry runs afresh.

The envs service unreachable is 503 ``envs_unavailable`` and past the deadline 504: both
retryable, never a reward of 0. Its own answers (404 for another team's session, 422
naming a field, 503 when the sandbox is down) are relayed as they are.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter as Tally
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from urllib.parse import quote

import aiohttp
from prometheus_client import Counter
from starlette.responses import Response, StreamingResponse

from arbiter.errors import (
    ArbiterError,
    BadResponse,
    NotConfigured,
    NotFound,
    RateLimited,
    Timeout,
    Unavailable,
    from_response,
    to_envelope,
)
from arbiter.keys import Principal
from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.envs import DEPLOYMENT_HEADER, ERROR_COMMENT, USAGE_COMMENT
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.gateway.envs_quota import EnvsQuota
from arbiter.services.gateway.idempotency import REPLAYED, Claim, Replay, check_key
from arbiter.services.gateway.settings import GatewaySettings
from arbiter.services.gateway.slots import TeamSlots
from arbiter.services.gateway.teams import Teams

log = logging.getLogger("arbiter.gateway.envs")
FAILURES_LOG = ThrottledLog(log)

SESSION_HEADER = "X-Session-ID"
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # an episode's answers are small; past this, a fault
# Headers of the caller's request the envs service needs, and of its answer the caller gets.
REQUEST_HEADERS = ("content-type", "accept", SESSION_HEADER.lower(), DEPLOYMENT_HEADER.lower())
ANSWER_HEADERS = ("content-type", "cache-control", SESSION_HEADER.lower())
NO_TYPE = ("Content-Type",)  # a bodiless POST goes without one (aiohttp's default: bytes)
TOOL_CALL = re.compile(r"([^/]+/)?call")  # /{env}/call, or the bare /call (openreward)
USAGE_LINE = USAGE_COMMENT.encode()

ENVS_CALLS = Counter(
    "arbiter_gateway_envs_calls_total",
    "Calls forwarded to the envs service, by kind (tool, other, discovery) and outcome "
    "(the envs service's HTTP status, or unavailable / timeout).",
    ["kind", "outcome"],
)


def envs_path(path: str) -> str:
    """``path`` with each segment percent-quoted: a caller's ``env_name`` is one segment of
    the envs service's path, never a query (``readyz?``), a fragment or a step up (``..``)
    reaching a route the gateway does not serve."""
    segments = path.split("/")
    if any(s in ("", ".", "..") for s in segments):
        raise NotFound(
            f"env_name: unknown environment in {path[:64]!r}",
            param="env_name",
            code="unknown_environment",
        )
    return "/".join(quote(s, safe="") for s in segments)


def is_tool_call(method: str, path: str) -> bool:
    return method == "POST" and TOOL_CALL.fullmatch(path) is not None


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


class EnvsProxy:
    """Built once in the gateway's lifespan (``app.state.envs``), with its own session."""

    def __init__(self, settings: GatewaySettings, teams: Teams):
        self.url = settings.envs_url
        self.timeout_s = settings.envs_timeout_s
        self.teams = teams
        limit = settings.max_concurrency
        self.slots = TeamSlots(limit, min(settings.team_concurrency, limit))
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=4.0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_s),
            headers={"accept-encoding": "identity"},
        )
        self.quota: EnvsQuota | None = None
        if teams.redis is not None and teams.auth:  # as the scoring quotas: auth on only
            share = 1 / (settings.quota_replicas * settings.processes)
            calls = settings.envs_tool_calls_per_minute
            cpu_s = settings.envs_sandbox_cpu_s_per_minute
            self.quota = EnvsQuota(teams.redis, calls, cpu_s, share=share)

    async def close(self) -> None:
        await self.session.close()

    async def forward(
        self,
        who: Principal | None,
        method: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        idempotency_key: str | None = None,
        *,
        stream: bool = False,
    ) -> Response:
        """The envs service's answer to ``method /path`` (see the module docstring). A tool
        call is relayed as its stream comes (``stream``, the ORS routes) or answered whole,
        a call that did not answer raised as the error it was (NeMo Gym's routes)."""
        if self.url is None:
            raise NotConfigured(
                "environments are not configured on this gateway: set GATEWAY_ENVS_URL "
                "to the envs service (`arbiter serve envs`)",
                code="envs_not_configured",
            )
        path = envs_path(path)
        sent = {k: v for k, v in headers.items() if k.lower() in REQUEST_HEADERS}
        if who is None:
            return await self._send("discovery", method, path, body, sent, None)
        sent[TEAM_HEADER] = who.team
        idem = self.teams.idempotency
        claim: Claim | None = None
        if method == "POST" and idempotency_key is not None and idem is not None:
            # the sid is part of the request: a key sent again on another episode is 422,
            # never that episode answered with the first one's result
            sid = next((v for k, v in sent.items() if k.lower() == SESSION_HEADER.lower()), "")
            where = f"{path} {sid}" if sid else path
            found = await idem.begin(who.team, check_key(idempotency_key), method, where, body)
            if isinstance(found, Replay):
                await self._record(who, Tally(idempotent_replays=1))
                return _replayed(found.body)
            claim = found
        if is_tool_call(method, path):
            return await self._tool_call(who, path, body, sent, claim, stream)
        ok = False
        try:
            answer = await self._other(who, method, path, body, sent)
            ok = answer.status_code == 200
            if claim is not None and idem is not None and ok:
                await idem.finish(claim, _stored(answer))
        finally:
            if claim is not None and idem is not None and not ok:
                await asyncio.shield(idem.release(claim))
        return answer

    async def _other(
        self, who: Principal, method: str, path: str, body: bytes, sent: dict[str, str]
    ) -> Response:
        """A call that is not a tool call. An episode opened takes a call from the quota:
        it holds up to a few hundred KB of task in the state Redis (noeviction) for its
        TTL, so opening them must be bounded; it is given back unless answered 200."""
        metered = method == "POST" and path == "create"
        if metered:
            await self._take(who)
        answer = None
        try:
            answer = await self._send("other", method, path, body, sent, who.team)
            return answer
        finally:
            if metered and (answer is None or answer.status_code != 200):
                await self._refund(who.team)

    async def _tool_call(
        self,
        who: Principal,
        path: str,
        body: bytes,
        sent: dict[str, str],
        claim: Claim | None,
        stream: bool,
    ) -> Response:
        """A tool call: one from the quota before it is sent; its stream relayed, settled
        at its end (``_relay``). An answer before the stream (no such episode, bad input)
        ran nothing: the call is given back."""
        stack = AsyncExitStack()
        try:
            await self._take(who)
            try:
                resp = await self._open(stack, path, body, sent, who.team)
            except BaseException:
                await self._refund(who.team)
                raise
            if resp.status != 200:
                answer = await self._answer(resp)
                await stack.aclose()
                await self._refund(who.team)
                await self._release(claim)
                return answer
        except BaseException:
            await asyncio.shield(stack.aclose())
            await self._release(claim)
            raise
        headers = {k: v for k, v in resp.headers.items() if k.lower() in ANSWER_HEADERS}
        relay = self._relay(resp, stack, who, claim)
        if stream:
            return StreamingResponse(relay, status_code=200, headers=headers)
        whole = b"".join([part async for part in relay])
        return _whole(whole, headers)

    async def _relay(
        self,
        resp: aiohttp.ClientResponse,
        stack: AsyncExitStack,
        who: Principal,
        claim: Claim | None,
    ) -> AsyncIterator[bytes]:
        """The call's SSE, block by block as the envs service sends it, less its usage
        comment, which settles the call: its CPU charged, its call given back if nothing
        ran. A stream cut short (the caller gone, the envs service down or past the
        deadline) keeps the call taken and charges no CPU; an ORS client resumes it with
        its ``task_id``, and that stream carries the cost."""
        usage: tuple[int, int] | None = None
        kept = [resp.headers.get("content-type", "text/event-stream").encode("latin-1") + b"\n"]
        size, ended = 0, False
        deadline = asyncio.get_running_loop().time() + self.timeout_s
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
                yield _error_comment(self._late())
            except (aiohttp.ClientError, BadResponse) as exc:
                ENVS_CALLS.labels("tool", "unavailable").inc()
                FAILURES_LOG.warning("stream", "envs: a tool call's stream broke: %s", exc)
                yield _error_comment(_unreachable(exc))
        finally:
            await asyncio.shield(self._settle(who, usage, claim, ended, kept, stack))

    async def _settle(
        self,
        who: Principal,
        usage: tuple[int, int] | None,
        claim: Claim | None,
        ended: bool,
        kept: list[bytes],
        stack: AsyncExitStack,
    ) -> None:
        await stack.aclose()
        if usage is not None:
            calls, cpu_ms = usage
            if self.quota is not None:
                await self.quota.charge(who.team, cpu_ms)
            if calls > 0 or cpu_ms > 0:
                await self._record(who, Tally(env_tool_calls=calls, sandbox_cpu_ms=cpu_ms))
            else:  # a resend that re-attached, or a call that did not run
                await self._refund(who.team)
        idem = self.teams.idempotency
        if claim is not None and idem is not None and ended:
            await idem.finish(claim, b"".join(kept))  # its content type, a line, then the body
        else:
            await self._release(claim)

    async def _open(
        self, stack: AsyncExitStack, path: str, body: bytes, sent: dict[str, str], team: str
    ) -> aiohttp.ClientResponse:
        """The tool call's answer, its headers read (its body to come), within the team's
        slot (held until ``stack`` closes); 503/504 when the envs service is not there."""
        url = f"{self.url}/{path}"
        try:
            async with asyncio.timeout(self.timeout_s):
                await stack.enter_async_context(self.slots.slot(team, object()))
                return await stack.enter_async_context(
                    self.session.request("POST", url, data=body or None, headers=sent)
                )
        except TimeoutError:
            ENVS_CALLS.labels("tool", "timeout").inc()
            raise self._late() from None
        except aiohttp.ClientError as exc:
            ENVS_CALLS.labels("tool", "unavailable").inc()
            FAILURES_LOG.warning("connect", "envs: %s: %s", url, exc)
            raise _unreachable(exc) from None

    async def _send(
        self,
        kind: str,
        method: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        team: str | None,
    ) -> Response:
        """The answer to relay, whole; raises 503/504/502."""
        url = f"{self.url}/{path}"
        try:
            async with (
                asyncio.timeout(self.timeout_s),
                self.slots.slot(team or "", object()),
                self.session.request(
                    method, url, data=body or None, headers=headers, skip_auto_headers=NO_TYPE
                ) as resp,
            ):
                answer = await self._answer(resp)
        except TimeoutError:
            ENVS_CALLS.labels(kind, "timeout").inc()
            raise self._late() from None
        except aiohttp.ClientError as exc:
            ENVS_CALLS.labels(kind, "unavailable").inc()
            FAILURES_LOG.warning("connect", "envs: %s: %s", url, exc)
            raise _unreachable(exc) from None
        ENVS_CALLS.labels(kind, str(answer.status_code)).inc()
        return answer

    async def _answer(self, resp: aiohttp.ClientResponse) -> Response:
        content = await _read(resp)
        if len(content) > MAX_ANSWER_BYTES:
            raise BadResponse(f"the envs service answered more than {MAX_ANSWER_BYTES} bytes")
        relayed = {k: v for k, v in resp.headers.items() if k.lower() in ANSWER_HEADERS}
        return Response(content, status_code=resp.status, headers=relayed)

    def _late(self) -> Timeout:
        return Timeout(
            f"the envs service did not answer within {self.timeout_s:g} s "
            "(GATEWAY_ENVS_TIMEOUT_S); retry",
            code="envs_timeout",
        )

    async def _take(self, who: Principal) -> None:
        if self.quota is None:
            return
        try:
            await self.quota.take(who.team)
        except RateLimited:
            await self._record(who, Tally(rate_limited=1))
            raise

    async def _refund(self, team: str) -> None:
        if self.quota is not None:
            await asyncio.shield(self.quota.refund(team))

    async def _release(self, claim: Claim | None) -> None:
        idem = self.teams.idempotency
        if claim is not None and idem is not None:
            await asyncio.shield(idem.release(claim))

    async def _record(self, who: Principal, counts: Tally[str]) -> None:
        if self.teams.auth:
            await self.teams.record(who.team, +counts)


async def _read(resp: aiohttp.ClientResponse) -> bytes:
    """The whole body, or its first ``MAX_ANSWER_BYTES`` + 1 bytes (the caller refuses it)."""
    parts, size = [], 0
    async for part in resp.content.iter_chunked(64 * 1024):
        parts.append(part)
        size += len(part)
        if size > MAX_ANSWER_BYTES:
            break
    return b"".join(parts)


def _stored(answer: Response) -> bytes:
    """What is kept for an ``Idempotency-Key``: the content type on a line, then the body."""
    ctype = answer.headers.get("content-type", "application/octet-stream")
    return ctype.encode("latin-1") + b"\n" + bytes(answer.body)


def _replayed(stored: bytes) -> Response:
    ctype, _, body = stored.partition(b"\n")
    return Response(
        body, status_code=200, headers={"content-type": ctype.decode("latin-1"), REPLAYED: "true"}
    )


def _unreachable(exc: BaseException) -> Unavailable:
    return Unavailable(
        f"the envs service is unreachable ({type(exc).__name__}); retry", code="envs_unavailable"
    )


def _error_comment(exc: ArbiterError) -> bytes:
    """A failure of the relay itself, as the envs service reports one in its stream."""
    status, body = to_envelope(exc)
    return f"{ERROR_COMMENT}{status} {body.model_dump_json()}\n\n".encode()


def _whole(body: bytes, headers: Mapping[str, str]) -> Response:
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
