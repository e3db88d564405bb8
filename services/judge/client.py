"""The one boundary to the judge server: a shared ``httpx.AsyncClient`` with bounded
concurrency, a deadline per call, and retries with jittered exponential back-off.

Outside failures leave this module as ``arbiter.errors`` exceptions whose ``kind`` the
item gets: ``Timeout`` (past the deadline), ``Unavailable`` (connection refused/reset,
429 or 5xx after the retries), an ``InvalidRequest`` (another 4xx, e.g. a prompt too long;
``from_response`` reads the server's message) or ``BadResponse`` (a body that is not a chat
completion); the last two are ``bad_response`` and are not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from prometheus_client import Counter, Histogram

from arbiter.errors import (
    ArbiterError,
    BadResponse,
    InvalidRequest,
    Timeout,
    Unavailable,
    from_response,
)
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.judge.settings import JudgeSettings

log = logging.getLogger("arbiter.judge")
# One line per component and kind per 10 s while the model server is down, with a count.
FAILURES_LOG = ThrottledLog(log)

UPSTREAM_SECONDS = Histogram(
    "arbiter_judge_upstream_seconds",
    "Judge server call latency (one attempt) by component and outcome.",
    ["component", "outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
RETRIES = Counter(
    "arbiter_judge_upstream_retries_total", "Retried judge server calls.", ["component", "reason"]
)
FAILURES = Counter(
    "arbiter_judge_upstream_failures_total",
    "Judge server calls that failed for good, by kind.",
    ["component", "kind"],
)
TOKENS = Counter(
    "arbiter_judge_tokens_total",
    "Tokens the judge server reports: prompt, completion, and cached prompt tokens.",
    ["component", "type"],
)


# httpcore's connection pool does work proportional to (requests x connections) on every
# request start and end; at 32 in flight that was most of the judge's CPU (profiled: ~60 %
# in _assign_requests_to_connections). Connections are therefore split over pools of at
# most SHARD connections; one slot queue still bounds the whole service's concurrency.
SHARD = 8


class _Slots:
    """``max_concurrency`` numbered slots; slot i always uses pool i % len(pools)."""

    def __init__(self, n: int):
        self._free: asyncio.Queue[int] = asyncio.Queue()
        for i in range(n):
            self._free.put_nowait(i)

    @contextlib.asynccontextmanager
    async def take(self) -> AsyncIterator[int]:
        slot = await self._free.get()
        try:
            yield slot
        finally:
            self._free.put_nowait(slot)


class ChatClient:
    """Calls ``{base_url}/chat/completions`` and ``{base_url}/models``.

    The service holds one of these: a shared set of keep-alive connections (a few
    ``httpx.AsyncClient`` pools, see ``SHARD``) behind one concurrency bound.
    """

    def __init__(self, settings: JudgeSettings):
        self.settings = settings
        headers = {}
        key = settings.api_key.get_secret_value()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        n_pools = -(-settings.max_concurrency // SHARD)
        per_pool = -(-settings.max_concurrency // n_pools)
        limits = httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool)
        self._pools = [
            httpx.AsyncClient(
                base_url=settings.base_url + "/",
                headers=headers,
                limits=limits,
                timeout=httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s),
            )
            for _ in range(n_pools)
        ]
        self._slots = _Slots(settings.max_concurrency)
        self._model: str | None = settings.model or None

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()

    async def list_models(self, wait_s: float = 5.0) -> list[str]:
        resp = await self._pools[0].get("models", timeout=wait_s)
        if resp.status_code != 200:
            raise Unavailable(f"listing models: {from_response(resp.status_code, resp.content)}")
        data = resp.json().get("data", [])
        return [str(m.get("id")) for m in data if isinstance(m, dict)]

    async def model(self) -> str:
        """The configured model, or the first one the server lists (cached once found)."""
        if self._model is None:
            try:
                models = await self.list_models()
            except httpx.HTTPError as exc:
                raise Unavailable(f"listing models: {type(exc).__name__}: {exc}") from exc
            if not models:
                raise Unavailable("the judge server lists no models")
            self._model = models[0]
            log.info("judge model: %s (first listed by %s)", self._model, self.settings.base_url)
        return self._model

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        s = self.settings
        delay = min(s.backoff_max_s, s.backoff_s * (2**attempt)) * random.uniform(0.5, 1.0)
        if retry_after:
            with contextlib.suppress(ValueError):
                delay = max(delay, min(float(retry_after), s.backoff_max_s))
        return delay

    async def chat(
        self, payload: dict[str, Any], component: str, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """POST one chat completion; the whole call (retries included) has one deadline."""
        try:
            return await self._chat(payload, component, timeout_s)
        except ArbiterError as exc:
            FAILURES.labels(component, exc.kind).inc()
            if not isinstance(exc, InvalidRequest):  # the caller's own error: not a warning
                FAILURES_LOG.warning((component, exc.kind), "judge call failed: %s", exc.message)
            raise

    async def _chat(
        self, payload: dict[str, Any], component: str, timeout_s: float | None
    ) -> dict[str, Any]:
        s = self.settings
        budget = timeout_s or s.timeout_s
        deadline = time.monotonic() + budget
        body = {"model": await self.model(), **payload}
        last: ArbiterError = Unavailable("no attempt made")
        for attempt in range(s.max_retries + 1):
            retry_after = None
            async with self._slots.take() as slot:
                http = self._pools[slot % len(self._pools)]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                start = time.perf_counter()
                outcome = "ok"
                try:
                    resp = await http.post(
                        "chat/completions",
                        json=body,
                        timeout=httpx.Timeout(
                            remaining, connect=min(remaining, s.connect_timeout_s)
                        ),
                    )
                except httpx.TimeoutException as exc:
                    outcome = "timeout"
                    last = Timeout(
                        f"judge server did not answer within {budget:g}s ({type(exc).__name__})"
                    )
                    break
                except httpx.TransportError as exc:
                    outcome = "connection_error"
                    last = Unavailable(f"judge server unreachable: {type(exc).__name__}")
                else:
                    if resp.status_code == 200:
                        try:
                            data = resp.json()
                        except ValueError as exc:
                            outcome = "bad_response"
                            raise BadResponse("judge server sent non-JSON") from exc
                        if not isinstance(data, dict) or not data.get("choices"):
                            outcome = "bad_response"
                            raise BadResponse(f"judge reply has no choices: {data!r:.200}")
                        self._count_tokens(component, data)
                        return data
                    outcome = f"http_{resp.status_code}"
                    last = from_response(resp.status_code, resp.content)
                    if not last.retryable:  # a 4xx other than 429: the same request fails again
                        raise last
                    retry_after = resp.headers.get("retry-after")
                finally:
                    UPSTREAM_SECONDS.labels(component, outcome).observe(time.perf_counter() - start)
            if attempt == s.max_retries:
                break
            delay = self._backoff(attempt, retry_after)
            if time.monotonic() + delay >= deadline:
                last = Timeout(f"judge server not answering within {budget:g}s (last: {last})")
                break
            RETRIES.labels(component, last.kind).inc()
            await asyncio.sleep(delay)
        if time.monotonic() >= deadline and not isinstance(last, Timeout):
            last = Timeout(f"judge server not answering within {budget:g}s ({last})")
        raise last

    @staticmethod
    def _count_tokens(component: str, data: dict[str, Any]) -> None:
        usage = data.get("usage") or {}
        TOKENS.labels(component, "prompt").inc(int(usage.get("prompt_tokens") or 0))
        TOKENS.labels(component, "completion").inc(int(usage.get("completion_tokens") or 0))
        details = usage.get("prompt_tokens_details") or {}
        TOKENS.labels(component, "cached_prompt").inc(int(details.get("cached_tokens") or 0))
