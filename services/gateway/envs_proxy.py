"""Calls to the envs service on a team's behalf: the work behind ``/ors`` and
``/nemo-gym/envs`` (``ors.py``, ``nemo_envs.py``), importable without FastAPI.

``EnvsProxy.forward`` takes an authenticated call (``who``; None for the ORS discovery
routes, which need no key and carry no team) and, in this order:

1. ``Idempotency-Key`` on a POST (``idempotency.py``): the stored answer of an earlier call
   with the key (the same path, ``X-Session-ID`` and body) is answered again, byte for
   byte, with its content type (``Idempotent-Replayed: true``; not forwarded, not counted
   again); a new key is claimed. If the key's store fails, the call is not forwarded (503
   ``idempotency_unavailable``): unlike a score, an episode's call is not idempotent by
   itself, and a retry must never run it twice.
2. quota (``envs_quota.py``): a tool call (``POST /{env}/call``, or the bare ``/call``)
   or an episode opened (``POST /create``) takes one from the team's tool-call bucket, and
   passes only while its sandbox-CPU bucket is above zero (429).
3. the call goes to ``GATEWAY_ENVS_URL`` with the team in ``X-Arbiter-Team`` (the envs
   service keeps each team's sessions apart by it) within the team's fair share of
   ``GATEWAY_MAX_CONCURRENCY`` slots (``scoring.slots.TeamSlots``) and ``GATEWAY_ENVS_TIMEOUT_S``.
   Its answer is relayed: JSON whole; a tool call's SSE stream as it comes
   (``envs_relay.relay``: ``task_id`` first, keep-alives, the result), or whole for a
   caller that wants it so (NeMo Gym's routes).
4. settlement, when a tool call's stream ends: the sandbox CPU the envs service reports in
   its ``: arbiter-usage`` comment (never relayed) is charged to the quota and recorded in
   the usage ledger (``env_tool_calls``, ``sandbox_cpu_ms``); a call that ran nothing (the
   envs service refused it before its stream, or the stream re-attached to a run already
   reported) gets its call back; a stream cut short keeps its call and charges no CPU (its
   run is charged on the stream that delivers its answer). A ``/create`` not answered 200
   gets its call back. A complete answer is stored for its key; any other releases the
   key so a retry runs afresh.

The envs service unreachable is 503 ``envs_unavailable`` and past the deadline 504: both
retryable, never a reward of 0. Its own answers (404 for another team's session, 422
naming a field, 503 when the sandbox is down) are relayed as they are.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections import Counter as Tally
from collections.abc import Mapping
from contextlib import AsyncExitStack
from urllib.parse import quote

import aiohttp
from starlette.responses import Response, StreamingResponse

from arbiter.errors import (
    BadResponse,
    NotConfigured,
    NotFound,
    RateLimited,
    Unavailable,
)
from arbiter.keys import Principal
from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.envs import DEPLOYMENT_HEADER
from arbiter.services.gateway.envs_quota import EnvsQuota
from arbiter.services.gateway.envs_relay import (
    ENVS_CALLS,
    FAILURES_LOG,
    MAX_ANSWER_BYTES,
    late,
    relay,
    unreachable,
    whole,
)
from arbiter.services.gateway.idempotency import HEADER, REPLAYED, Claim, Replay, check_key
from arbiter.services.gateway.settings import GatewaySettings
from arbiter.services.gateway.teams import Teams
from arbiter.services.scoring.slots import TeamSlots

SESSION_HEADER = "X-Session-ID"
# Headers of the caller's request the envs service needs, and of its answer the caller gets.
REQUEST_HEADERS = ("content-type", "accept", SESSION_HEADER.lower(), DEPLOYMENT_HEADER.lower())
ANSWER_HEADERS = ("content-type", "cache-control", SESSION_HEADER.lower())
NO_TYPE = ("Content-Type",)  # a bodiless POST goes without one (aiohttp's default: bytes)
TOOL_CALL = re.compile(r"([^/]+/)?call")  # /{env}/call, or the bare /call (openreward)


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
            if found is None:  # an episode's call is not run without its key's guarantee
                raise Unavailable(
                    f"{HEADER}: the key's store (the state Redis) failed; nothing ran, retry "
                    "with the same key",
                    code="idempotency_unavailable",
                )
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
        settle = functools.partial(self._settle, who, claim, stack)
        events = relay(resp, self.timeout_s, settle)
        if stream:
            return StreamingResponse(events, status_code=200, headers=headers)
        return whole(b"".join([part async for part in events]), headers)

    async def _settle(
        self,
        who: Principal,
        claim: Claim | None,
        stack: AsyncExitStack,
        usage: tuple[int, int] | None,
        kept: list[bytes] | None,
    ) -> None:
        """A tool call's stream ended: its CPU charged, its call given back if nothing ran
        (``usage`` None: cut short, the call kept, no CPU charged); its answer stored for
        its ``Idempotency-Key`` (``kept``: its content type, then the stream) if it ended
        with the result."""
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
        if claim is not None and idem is not None and kept is not None:
            await idem.finish(claim, b"".join(kept))
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
            raise late(self.timeout_s) from None
        except aiohttp.ClientError as exc:
            ENVS_CALLS.labels("tool", "unavailable").inc()
            FAILURES_LOG.warning("connect", "envs: %s: %s", url, exc)
            raise unreachable(exc) from None

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
            raise late(self.timeout_s) from None
        except aiohttp.ClientError as exc:
            ENVS_CALLS.labels(kind, "unavailable").inc()
            FAILURES_LOG.warning("connect", "envs: %s: %s", url, exc)
            raise unreachable(exc) from None
        ENVS_CALLS.labels(kind, str(answer.status_code)).inc()
        return answer

    async def _answer(self, resp: aiohttp.ClientResponse) -> Response:
        content = await _read(resp)
        if len(content) > MAX_ANSWER_BYTES:
            raise BadResponse(f"the envs service answered more than {MAX_ANSWER_BYTES} bytes")
        relayed = {k: v for k, v in resp.headers.items() if k.lower() in ANSWER_HEADERS}
        return Response(content, status_code=resp.status, headers=relayed)

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
