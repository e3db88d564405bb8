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
from collections.abc import Mapping
from urllib.parse import quote

import aiohttp
from prometheus_client import Counter
from starlette.responses import Response

from arbiter.errors import (
    BadResponse,
    NotConfigured,
    NotFound,
    RateLimited,
    Timeout,
    Unavailable,
)
from arbiter.keys import Principal
from arbiter.proto.common import TEAM_HEADER
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.gateway.envs_quota import EnvsQuota
from arbiter.services.gateway.idempotency import REPLAYED, Claim, Replay, check_key
from arbiter.services.gateway.settings import GatewaySettings
from arbiter.services.gateway.slots import TeamSlots
from arbiter.services.gateway.teams import Teams

log = logging.getLogger("arbiter.gateway.envs")
FAILURES_LOG = ThrottledLog(log)

USAGE_HEADER = "X-Arbiter-Usage"
SESSION_HEADER = "X-Session-ID"
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # an episode's answers are small; past this, a fault
# Headers of the caller's request the envs service needs, and of its answer the caller gets.
REQUEST_HEADERS = ("content-type", "accept", SESSION_HEADER.lower(), "last-event-id")
ANSWER_HEADERS = ("content-type", "cache-control", SESSION_HEADER.lower())
NO_TYPE = ("Content-Type",)  # a bodiless POST goes without one (aiohttp's default: bytes)
TOOL_CALL = re.compile(r"[^/]+/call")

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


def read_usage(value: str | None) -> tuple[int, int]:
    """(tool calls, sandbox CPU ms) of the envs service's ``X-Arbiter-Usage``; (0, 0) for
    none or one that is not the contract (logged: the call is not charged twice)."""
    if not value:
        return 0, 0
    try:
        doc = json.loads(value)
        calls, cpu = int(doc.get("tool_calls", 0)), int(doc.get("sandbox_cpu_ms", 0))
    except (ValueError, TypeError, AttributeError):
        FAILURES_LOG.warning("usage", "envs: %s is not the contract: %.200r", USAGE_HEADER, value)
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
    ) -> Response:
        """The envs service's answer to ``method /path`` (see the module docstring)."""
        if self.url is None:
            raise NotConfigured(
                "environments are not configured on this gateway: set GATEWAY_ENVS_URL "
                "to the envs service (`arbiter serve envs`)",
                code="envs_not_configured",
            )
        path = envs_path(path)
        sent = {k: v for k, v in headers.items() if k.lower() in REQUEST_HEADERS}
        if who is None:
            answer, _ = await self._send("discovery", method, path, body, sent, None)
            return answer
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
        ok = False
        try:
            answer = await self._settled(who, method, path, body, sent)
            ok = answer.status_code == 200
            if claim is not None and idem is not None and ok:
                await idem.finish(claim, _stored(answer))
        finally:
            if claim is not None and idem is not None and not ok:
                await asyncio.shield(idem.release(claim))
        return answer

    async def _settled(
        self, who: Principal, method: str, path: str, body: bytes, sent: dict[str, str]
    ) -> Response:
        tool = is_tool_call(method, path)
        # an episode opened takes a call too: it holds up to a few hundred KB of task in
        # the state Redis (noeviction) for its TTL, so opening them must be bounded
        metered = tool or (method == "POST" and path == "create")
        team = who.team
        if metered and self.quota is not None:
            try:
                await self.quota.take(team)
            except RateLimited:
                await self._record(who, Tally(rate_limited=1))
                raise
        kept = False  # the call taken is kept: the tool ran, or the episode was opened
        try:
            kind = "tool" if tool else "other"
            answer, usage = await self._send(kind, method, path, body, sent, team)
            calls, cpu_ms = read_usage(usage)
            ran = calls > 0 or cpu_ms > 0
            kept = ran or (not tool and answer.status_code == 200)
            if self.quota is not None:
                await asyncio.shield(self.quota.charge(team, cpu_ms))
            if ran:
                await self._record(who, Tally(env_tool_calls=calls, sandbox_cpu_ms=cpu_ms))
            return answer
        finally:
            if metered and not kept and self.quota is not None:
                await asyncio.shield(self.quota.refund(team))

    async def _send(
        self,
        kind: str,
        method: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        team: str | None,
    ) -> tuple[Response, str | None]:
        """(the answer to relay, its ``X-Arbiter-Usage``); raises 503/504/502."""
        url = f"{self.url}/{path}"
        try:
            async with (
                asyncio.timeout(self.timeout_s),
                self.slots.slot(team or "", object()),
                self.session.request(
                    method, url, data=body or None, headers=headers, skip_auto_headers=NO_TYPE
                ) as resp,
            ):
                content = await _read(resp)
                status, answer_headers = resp.status, resp.headers
        except TimeoutError:
            ENVS_CALLS.labels(kind, "timeout").inc()
            raise Timeout(
                f"the envs service did not answer within {self.timeout_s:g} s "
                "(GATEWAY_ENVS_TIMEOUT_S); retry",
                code="envs_timeout",
            ) from None
        except aiohttp.ClientError as exc:
            ENVS_CALLS.labels(kind, "unavailable").inc()
            FAILURES_LOG.warning("connect", "envs: %s: %s", url, exc)
            raise Unavailable(
                f"the envs service is unreachable ({type(exc).__name__}); retry",
                code="envs_unavailable",
            ) from None
        ENVS_CALLS.labels(kind, str(status)).inc()
        if len(content) > MAX_ANSWER_BYTES:
            raise BadResponse(f"the envs service answered more than {MAX_ANSWER_BYTES} bytes")
        relayed = {k: v for k, v in answer_headers.items() if k.lower() in ANSWER_HEADERS}
        answer = Response(content, status_code=status, headers=relayed)
        return answer, answer_headers.get(USAGE_HEADER)

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
