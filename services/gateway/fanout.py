"""Calls to the component services: one shared httpx client, bounded, with deadlines.

``ComponentClient.call`` never raises for a component's failure: it returns either the
parsed ``ComponentResponse`` or the ``ArbiterError`` that stands for the failure, whose
``kind`` the nulled items get (``arbiter.errors.from_response``: ``unavailable`` for
connection errors, 5xx and 429; ``timeout`` past the component's deadline or on a 504;
``bad_response`` for a body that is not the contract or a 4xx). A 4xx that names
``params`` is the caller's bad recipe params and comes back as an ``InvalidRequest``.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from arbiter.errors import (
    ArbiterError,
    BadResponse,
    InvalidRequest,
    Timeout,
    Unavailable,
    Unprocessable,
    from_response,
)
from arbiter.proto.components import ComponentResponse
from arbiter.services.gateway.recipes import ComponentSpec
from arbiter.services.gateway.settings import SERVICES, GatewaySettings
from arbiter.services.gateway.transport import LeanTransport

log = logging.getLogger("arbiter.gateway.fanout")

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


# A failure is a value here: the nulled items get its kind; only an ``InvalidRequest``
# (the caller's recipe params were refused) fails the request.
CallResult = ComponentResponse | ArbiterError


def env_var(service: str) -> str:
    return f"GATEWAY_{service.upper()}_URL"


class ComponentClient:
    """Owns the one ``httpx.AsyncClient`` and one concurrency slot pool per service."""

    def __init__(self, settings: GatewaySettings):
        self.settings = settings
        per_service = settings.max_concurrency
        limits = httpx.Limits(
            max_connections=per_service * len(SERVICES),
            max_keepalive_connections=per_service * len(SERVICES),
            keepalive_expiry=4.0,  # under uvicorn's 5 s: we close idle connections first
        )
        lean = settings.http_transport == "lean"
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.component_timeout_s, connect=settings.connect_timeout_s),
            limits=limits,
            transport=LeanTransport(limits) if lean else None,
            headers={"accept-encoding": "identity"},  # components answer small JSON bodies
        )
        self.slots = {s: asyncio.Semaphore(per_service) for s in SERVICES}
        self._urls: dict[str, httpx.URL] = {}

    async def close(self) -> None:
        await self.client.aclose()

    def url(self, spec: ComponentSpec) -> str | None:
        base = self.settings.component_url(spec.name, spec.service)
        return None if base is None else base + spec.path

    def _parsed_url(self, spec: ComponentSpec, url: str) -> httpx.URL:
        parsed = self._urls.get(spec.name)
        if parsed is None:  # parsed once per component, not per call
            parsed = self._urls[spec.name] = httpx.URL(url)
        return parsed

    async def call(self, spec: ComponentSpec, body: bytes) -> CallResult:
        url = self.url(spec)
        if url is None:
            return Unavailable(
                f"component {spec.name!r} needs the {spec.service} service, which is not "
                f"configured: set {env_var(spec.service)}",
            )
        timeout = self.settings.timeout_for(spec.name)
        start = time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                async with self.slots[spec.service]:
                    resp = await self.client.post(
                        self._parsed_url(spec, url),
                        content=body,
                        headers=JSON_HEADERS,
                        timeout=timeout,
                    )
                    result = self._parse(spec, resp)
        except (TimeoutError, httpx.TimeoutException):
            result = Timeout(f"{spec.name}: no answer from {url} within {timeout:g}s")
        except httpx.HTTPError as exc:
            result = Unavailable(f"{spec.name}: {url} unreachable ({type(exc).__name__}: {exc})")
        COMPONENT_SECONDS.labels(spec.name).observe(time.perf_counter() - start)
        if isinstance(result, ArbiterError):
            bad_params = isinstance(result, InvalidRequest)
            COMPONENT_CALLS.labels(spec.name, "bad_params" if bad_params else result.kind).inc()
            if not bad_params:
                log.warning("component call failed: %s", result.message)
        else:
            COMPONENT_CALLS.labels(spec.name, "ok").inc()
        return result

    def _parse(self, spec: ComponentSpec, resp: httpx.Response) -> CallResult:
        status = resp.status_code
        if status == 200:
            try:
                parsed = ComponentResponse.model_validate_json(resp.content)
            except ValidationError as exc:
                return BadResponse(f"{spec.name}: body is not a ComponentResponse: {exc}"[:500])
            return parsed
        error = from_response(status, resp.content, source=f"{spec.name} at {resp.request.url}")
        if not isinstance(error, InvalidRequest):
            return error
        if (error.param or "").split(".")[0] == "params":  # the caller's recipe params
            message = error.message.split(": ", 1)[-1]
            return Unprocessable(message, param=error.param, code="invalid_params")
        # Any other refusal: the gateway built a request the component does not take.
        return BadResponse(error.message)

    async def ready(self, service: str) -> str:
        base = self.settings.service_url(service)
        if base is None:
            return f"not configured (set {env_var(service)})"
        return await self.ready_url(base)

    async def ready_url(self, base: str) -> str:
        try:
            resp = await self.client.get(f"{base}/readyz", timeout=2.0)
        except httpx.HTTPError as exc:
            return f"{base} unreachable ({type(exc).__name__})"
        if resp.status_code != 200:
            return f"{base}/readyz answered HTTP {resp.status_code}"
        return "ok"
