"""The one boundary to the judge server: a shared ``aiohttp.ClientSession`` with bounded
concurrency, a deadline per call, and retries with jittered exponential back-off.

aiohttp because its client (C-accelerated HTTP parser) was measured at 0.16-0.32 ms of
CPU per call on a 2-core VM against httpx's 1.0-1.8 ms (same local server and body, 1 and
16 in flight), and its one connector serves all 32 calls in flight: httpcore's pool did
work proportional to requests x connections per call, which had the judge split its
connections over pools of 8.

Outside failures leave this module as ``arbiter.errors`` exceptions whose ``kind`` the
item gets: ``Timeout`` (past the deadline), ``Unavailable`` (connection refused/reset,
429 or 5xx after the retries), an ``InvalidRequest`` (another 4xx, e.g. a prompt too long;
``from_response`` reads the server's message) or ``BadResponse`` (a body that is not a chat
completion); the last two are ``bad_response`` and are not retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from typing import Any

import aiohttp
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


class ChatClient:
    """Calls ``{base_url}/chat/completions`` and ``{base_url}/models``.

    The service holds one of these (``Judge``, built in the lifespan): one
    ``aiohttp.ClientSession`` of keep-alive connections behind one concurrency bound.
    """

    def __init__(self, settings: JudgeSettings):
        self.settings = settings
        self._headers = {"content-type": "application/json"}
        key = settings.api_key.get_secret_value()
        if key:
            self._headers["authorization"] = f"Bearer {key}"
        self._chat_url = f"{settings.base_url}/chat/completions"
        self._models_url = f"{settings.base_url}/models"
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._model: str | None = settings.model or None

    def _http(self) -> aiohttp.ClientSession:
        """The session, opened by the first call: a session belongs to the event loop it
        was made in, and a ``Judge`` is also built outside any loop for its payloads."""
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.settings.max_concurrency,
                keepalive_timeout=4.0,  # under uvicorn's (vLLM's) 5 s: we close idle ones first
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                # the deadline is per call (``chat``'s budget), so no session-wide total
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self.settings.connect_timeout_s
                ),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def list_models(self, wait_s: float = 5.0) -> list[str]:
        try:
            async with self._http().get(
                self._models_url, timeout=aiohttp.ClientTimeout(total=wait_s)
            ) as resp:
                status, raw = resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:  # its text names host and port
            raise Unavailable(f"listing models: {type(exc).__name__}") from exc
        if status != 200:
            raise Unavailable(f"listing models: the judge server answered HTTP {status}")
        try:
            data = json.loads(raw).get("data", [])
        except (ValueError, AttributeError) as exc:
            raise BadResponse(f"listing models: not an OpenAI model list: {raw[:200]!r}") from exc
        return [str(m.get("id")) for m in data if isinstance(m, dict)]

    async def model(self) -> str:
        """The configured model, or the first one the server lists (cached once found)."""
        if self._model is None:
            models = await self.list_models()
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
        doc = {"model": await self.model(), **payload}
        body = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
        last: ArbiterError = Unavailable("no attempt made")
        for attempt in range(s.max_retries + 1):
            retry_after = None
            async with self._slots:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                start = time.perf_counter()
                outcome = "ok"
                timeout = aiohttp.ClientTimeout(
                    total=remaining, sock_connect=min(remaining, s.connect_timeout_s)
                )
                try:
                    async with self._http().post(
                        self._chat_url, data=body, timeout=timeout
                    ) as resp:
                        status, raw = resp.status, await resp.read()
                        retry_after = resp.headers.get("retry-after")
                except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors too
                    outcome = "timeout"
                    last = Timeout(
                        f"judge server did not answer within {budget:g}s ({type(exc).__name__})"
                    )
                    break
                except aiohttp.ClientError as exc:
                    outcome = "connection_error"
                    last = Unavailable(f"judge server unreachable: {type(exc).__name__}")
                else:
                    if status == 200:
                        try:
                            data = json.loads(raw)
                        except ValueError as exc:
                            outcome = "bad_response"
                            raise BadResponse("judge server sent non-JSON") from exc
                        if not isinstance(data, dict) or not data.get("choices"):
                            outcome = "bad_response"
                            raise BadResponse(f"judge reply has no choices: {data!r:.200}")
                        self._count_tokens(component, data)
                        return data
                    outcome = f"http_{status}"
                    last = from_response(status, raw)
                    if not last.retryable:  # a 4xx other than 429: the same request fails again
                        raise last
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
