"""Calls to the component services: one shared aiohttp session, bounded, with deadlines.

Part of the scoring core the gateway and the envs service share: each builds one
``ComponentClient`` from its own settings (``settings.ComponentSettings``).

aiohttp because its client (C-accelerated HTTP parser) was measured at 0.16-0.32 ms of
CPU per call on a 2-core VM against httpx's 1.0-1.8 ms, and a ``/v1/score`` makes one call
per component: with httpx that cost was most of the gateway's added latency (see
``bench/results/gateway_aiohttp.json``). The session is made in the service's lifespan
(``ComponentClient`` is built there) and closed with it.

``ComponentClient.call`` never raises for a component's failure: it returns either the
parsed ``ComponentResponse`` or the ``ArbiterError`` that stands for the failure, whose
``kind`` the nulled items get (``arbiter.errors.from_response``: ``unavailable`` for
connection errors, 5xx and 429; ``timeout`` past the component's deadline or on a 504;
``bad_response`` for a body that is not the contract or a 4xx). A 4xx that names
``params`` is the caller's bad recipe params and comes back as an ``InvalidRequest``.

Every call carries its team in ``X-Arbiter-Team`` (the component shares its work fairly
across teams) and waits for a slot in its team's fair share (``slots.TeamSlots``). Error
messages name the component, never its URL: they reach callers in error entries, and
``/readyz`` is unauthenticated. The URL goes to the (throttled) log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Protocol

import aiohttp
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from arbiter.errors import (
    ArbiterError,
    BadResponse,
    InvalidRequest,
    NotConfigured,
    Timeout,
    Unavailable,
    from_response,
)
from arbiter.keys import ANONYMOUS
from arbiter.proto.common import TEAM_HEADER
from arbiter.proto.components import ComponentResponse
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.scoring.recipes import ComponentSpec
from arbiter.services.scoring.settings import SERVICES, ComponentSettings
from arbiter.services.scoring.slots import TeamSlots

log = logging.getLogger("arbiter.scoring.fanout")
# One line per component and kind per 10 s during an outage, with a count of the rest.
FAILURES_LOG = ThrottledLog(log)

COMPONENT_SECONDS = Histogram(
    "arbiter_gateway_component_seconds",
    "Latency of one component call (queueing for a slot included).",
    ["component"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
)
COMPONENT_CALLS = Counter(
    "arbiter_gateway_component_calls_total", "Component calls by outcome.", ["component", "outcome"]
)

JSON_HEADERS = {"content-type": "application/json"}
READY_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
UNREACHABLE = "component_unreachable"  # the code of a call that could not connect at all


# A failure is a value here: the nulled items get its kind; only an ``InvalidRequest``
# (the caller's recipe params were refused) fails the request.
CallResult = ComponentResponse | ArbiterError


def env_var(service: str) -> str:
    return f"GATEWAY_{service.upper()}_URL"


# How to give the gateway each service, for every way of running it (docker-compose.yml's
# header, arbiter/stack.py's flags, the settings).
HOW_TO_ADD = {
    "judge": "docker compose: COMPOSE_PROFILES=cpu or gpu (or judge, with JUDGE_BASE_URL=<an "
    "OpenAI-compatible server>) and GATEWAY_JUDGE_URL=http://judge:8003 in .env; arbiter up: "
    "--judge-base-url URL --judge-model NAME (a running OpenAI-compatible server); "
    "otherwise: GATEWAY_JUDGE_URL=<the judge service's URL>",
    "embedding": "docker compose and arbiter up start it (unless GATEWAY_EMBEDDING_URL is set "
    "empty, or arbiter up --no-embedding); otherwise: GATEWAY_EMBEDDING_URL=<the embedding "
    "service's URL>",
    "verify": "docker compose and arbiter up start it; otherwise: GATEWAY_VERIFY_URL=<the "
    "verify service's URL>",
    "sandbox": "run `arbiter serve sandbox` (it needs bubblewrap) and set "
    "GATEWAY_SANDBOX_URL=<the sandbox service's URL>",
}


def missing_text(specs: Iterable[ComponentSpec]) -> str:
    """``needs the judge service (judge_quality), which this gateway has not configured
    (GATEWAY_JUDGE_URL is unset). To add the judge service: …``: every missing service
    once, with how to add it for each way of running the gateway."""
    by_service: dict[str, list[str]] = {}
    for spec in specs:
        by_service.setdefault(spec.service, []).append(spec.name)
    needs = " and ".join(f"the {s} service ({', '.join(n)})" for s, n in by_service.items())
    unset = ", ".join(env_var(s) for s in by_service)
    verb = "is" if len(by_service) == 1 else "are"
    fixes = " ".join(f"To add the {s} service: {HOW_TO_ADD[s]}." for s in by_service)
    return f"needs {needs}, which this gateway has not configured ({unset} {verb} unset). {fixes}"


def not_configured(spec: ComponentSpec) -> NotConfigured:
    """The refusal of a component whose service this gateway has no URL for."""
    return NotConfigured(f"component {spec.name!r} {missing_text([spec])}", param=None)


class Caller(Protocol):
    """What a component call goes through: ``ComponentClient`` (over HTTP) and
    ``grading.LocalGraders`` (the ``graders`` service, in process)."""

    async def call(
        self,
        spec: ComponentSpec,
        body: bytes,
        team: str = ANONYMOUS,
        request: Hashable = None,
        sent: Callable[[], None] | None = None,
        weight: int = 1,
    ) -> CallResult: ...


class ComponentClient:
    """Owns the one ``aiohttp.ClientSession`` and one concurrency slot pool per service.

    Build it inside the running event loop (the lifespan): the session belongs to it.
    """

    def __init__(self, settings: ComponentSettings):
        self.settings = settings
        per_service = settings.max_concurrency
        connector = aiohttp.TCPConnector(
            limit=per_service * len(SERVICES),  # the slots below bound each service
            keepalive_timeout=4.0,  # under uvicorn's 5 s: we close idle connections first
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            # a call's deadline (queueing for a slot included) is asyncio.timeout in `call`
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_s),
            headers={"accept-encoding": "identity"},  # components answer small JSON bodies
        )
        per_team = min(settings.team_concurrency, per_service)
        self.slots = {s: TeamSlots(per_service, per_team) for s in SERVICES}

    async def close(self) -> None:
        await self.session.close()

    def missing(self, specs: Iterable[ComponentSpec]) -> list[ComponentSpec]:
        """Those of ``specs`` whose service has no URL here (a deployment's choice: such a
        recipe is refused at admission: ``gateway.lifecycle``; the envs service offers no
        environment whose services it has no URL for)."""
        return [s for s in specs if self.url(s) is None]

    def url(self, spec: ComponentSpec) -> str | None:
        base = self.settings.component_url(spec.name, spec.service)
        return None if base is None else base + spec.path

    async def call(
        self,
        spec: ComponentSpec,
        body: bytes,
        team: str = ANONYMOUS,
        request: Hashable = None,
        sent: Callable[[], None] | None = None,
        weight: int = 1,
    ) -> CallResult:
        """POST ``body`` in ``team``'s share of the slots (``request``: the scoring call it
        belongs to; ``weight``: the team's weight, its share); ``sent`` is called once the
        call holds a slot and goes out."""
        url = self.url(spec)
        # Admission (``gateway.lifecycle``) refuses a recipe whose services have no URL here.
        assert url is not None, f"{spec.name}: called without a {spec.service} URL"
        timeout = self.settings.timeout_for(spec.name)
        headers = {**JSON_HEADERS, TEAM_HEADER: team}
        start = time.perf_counter()
        try:
            async with (
                asyncio.timeout(timeout),
                self.slots[spec.service].slot(team, request, weight),
            ):
                if sent is not None:
                    sent()
                try:
                    result = await self._post(spec, url, body, headers)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                    if isinstance(exc, aiohttp.ClientConnectorError):
                        raise  # could not connect at all: nothing stale to retry
                    # A kept-alive connection the component had closed (it restarted, or
                    # closed it as we reused it). Scoring is idempotent: once more, on a
                    # fresh connection.
                    result = await self._post(spec, url, body, headers)
        except TimeoutError:  # aiohttp's own timeouts are TimeoutErrors too
            result = Timeout(f"{spec.name}: no answer within {timeout:g}s")
        except aiohttp.ClientConnectorError as exc:
            FAILURES_LOG.warning((spec.name, "connect"), "%s: %s: %s", spec.name, url, exc)
            result = Unavailable(f"{spec.name}: {spec.service} unreachable", code=UNREACHABLE)
        except aiohttp.ClientError as exc:
            FAILURES_LOG.warning((spec.name, "client"), "%s: %s: %s", spec.name, url, exc)
            result = Unavailable(f"{spec.name}: {spec.service} failed ({type(exc).__name__})")
        COMPONENT_SECONDS.labels(spec.name).observe(time.perf_counter() - start)
        if isinstance(result, ArbiterError):
            bad_params = isinstance(result, InvalidRequest)
            COMPONENT_CALLS.labels(spec.name, "bad_params" if bad_params else result.kind).inc()
            if not bad_params:
                FAILURES_LOG.warning(
                    (spec.name, result.kind), "component call failed: %s", result.message
                )
        else:
            COMPONENT_CALLS.labels(spec.name, "ok").inc()
        return result

    async def _post(
        self, spec: ComponentSpec, url: str, body: bytes, headers: dict[str, str]
    ) -> CallResult:
        async with self.session.post(url, data=body, headers=headers) as resp:
            return self._parse(spec, resp.status, await resp.read())

    def _parse(self, spec: ComponentSpec, status: int, content: bytes) -> CallResult:
        if status == 200:
            try:
                parsed = ComponentResponse.model_validate_json(content)
            except ValidationError as exc:
                return BadResponse(f"{spec.name}: body is not a ComponentResponse: {exc}"[:500])
            return parsed
        error = from_response(status, content, source=spec.name)
        if not isinstance(error, InvalidRequest):
            return error
        if (error.param or "").split(".")[0] == "params":
            return error  # the caller's recipe params: ``merge`` names the recipe's field
        # Any other refusal: the gateway built a request the component does not take.
        return BadResponse(error.message)

    async def ready(self, service: str) -> str:
        base = self.settings.service_url(service)
        if base is None:
            return f"not configured (set {env_var(service)})"
        return await self.ready_url(base)

    async def ready_url(self, base: str) -> str:
        # The answer is served on the unauthenticated /readyz: what is down, never where.
        try:
            async with self.session.get(f"{base}/readyz", timeout=READY_TIMEOUT) as resp:
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            return f"unreachable ({type(exc).__name__})"
        if status != 200:
            return f"its /readyz answered HTTP {status}"
        return "ok"
