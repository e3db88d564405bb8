"""Python client for the gateway: sync and async scoring, retries, API key.

    from arbiter.client import ArbiterClient

    with ArbiterClient() as client:            # ARBITER_URL, ARBITER_API_KEY from the env
        out = client.score([{"prompt": q, "reference": "18", "responses": [r1, r2]}], "gsm8k")
        out.groups[0].rewards                  # [1.5, None]: None = could not score

Before a long job, ``client.check_recipe("gsm8k-dj")`` (one ``GET /v1/recipes``) raises
``NotConfigured`` when the gateway has not configured a component the recipe needs (no
judge, no embedding), with the reason and how to add it; a scoring call with such a recipe
is refused the same way (422 ``component_not_configured``), never retried.

Retryable answers (429 honouring ``Retry-After``, 503, 504, other 5xx) and connection
failures are retried with exponential backoff and jitter (``RetryPolicy``); a 200 whose
body is not the expected model raises ``BadResponse`` at once (the same request gets the
same body). Every scoring call sends one ``Idempotency-Key``, the same on each of its
retries, so a gateway that saw the first try can answer the retry from it instead of
scoring twice. The async side keeps one connection pool per event loop, so a client
survives several ``asyncio.run`` calls; ``max_connections`` bounds the requests in flight
(callers past it wait their turn, and that wait is not counted against ``timeout``). The
trainer scores through this client (``arbiter.trainer.rewards``). The TRL adapter lives in
``arbiter.integrations.trl``; ``trl_reward`` here is its alias.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from arbiter.bodies import GroupArg, Model, RecipeArg, recipe_problem, score_body
from arbiter.errors import (
    MAX_MESSAGE_CHARS,
    ArbiterError,
    BadResponse,
    NotConfigured,
    Timeout,
    Unavailable,
    from_response,
    is_retryable_status,
)
from arbiter.proto.common import Readiness
from arbiter.proto.gateway import (
    RecipeInfo,
    RecipeList,
    ScoreResponse,
)
from arbiter.retry import NO_RETRY, RETRY_EXCEPTIONS, RetryPolicy, retry_after_seconds

__all__ = [
    "DEFAULT_URL",
    "ArbiterClient",
    "ArbiterError",
    "NotConfigured",
    "RetryPolicy",
    "recipe_problem",
    "trl_reward",
]

log = logging.getLogger("arbiter.client")

DEFAULT_URL = "http://127.0.0.1:8000"


class ArbiterClient:
    """Sync and async calls to the gateway, each through one kept-alive connection pool.

    ``base_url`` defaults to ``$ARBITER_URL``, then ``http://127.0.0.1:8000``; ``api_key``
    to ``$ARBITER_API_KEY`` (sent as ``Authorization: Bearer``). ``timeout`` bounds each
    try (connecting: at most 10 s of it). ``max_connections`` sizes the pool for a caller
    with many requests at once (the trainer: one per group): at most that many requests
    are in flight per event loop and as many connections kept alive; an async caller past
    it waits for a free place without a deadline, and a retry's back-off gives its place
    up. None: httpx's pool (100 connections, 20 kept alive), no bound of its own. Use it
    as a context manager (``with`` / ``async with``) or call ``close()`` / ``aclose()``.
    Picklable: the pools are not carried, a copy opens its own.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        retry: RetryPolicy | None = None,
        max_connections: int | None = None,
        headers: dict[str, str] | None = None,
        **httpx_kwargs: Any,
    ) -> None:
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections must be >= 1 (or None), got {max_connections}")
        self.base_url = (base_url or os.environ.get("ARBITER_URL") or DEFAULT_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get("ARBITER_API_KEY")
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self.max_connections = max_connections
        self._headers = dict(headers or {})
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._kwargs = httpx_kwargs
        self._sync: httpx.Client | None = None
        # One AsyncClient per event loop: a pool is bound to the loop that opened it; so is
        # the semaphore that keeps at most max_connections requests in flight on that loop.
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]
        self._async = weakref.WeakKeyDictionary()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._slots = weakref.WeakKeyDictionary()

    # -- pools -----------------------------------------------------------------------------
    def _options(self) -> dict[str, Any]:
        timeout = httpx.Timeout(self.timeout, connect=min(10.0, self.timeout))
        options: dict[str, Any] = {"timeout": timeout, "headers": self._headers}
        if self.max_connections is not None:
            n = self.max_connections
            options["limits"] = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        return {**options, **self._kwargs}

    def _sync_client(self) -> httpx.Client:
        if self._sync is None:
            self._sync = httpx.Client(**self._options())
        return self._sync

    def _async_client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore | None]:
        """This loop's pool, and its semaphore when ``max_connections`` is set."""
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._async if lp.is_closed()]:
            # Its loop is gone, so it cannot be closed gracefully; its sockets close with it.
            del self._async[old]
        client = self._async.get(loop)
        if client is None:
            client = self._async[loop] = httpx.AsyncClient(**self._options())
        if self.max_connections is None:
            return client, None
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = asyncio.Semaphore(self.max_connections)
        return client, slots

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        """Close this loop's pool (and the sync one)."""
        loop = asyncio.get_running_loop()
        self._slots.pop(loop, None)
        client = self._async.pop(loop, None)
        if client is not None:
            await client.aclose()
        self.close()

    def __enter__(self) -> ArbiterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> ArbiterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sync"] = state["_async"] = state["_slots"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._async = weakref.WeakKeyDictionary()
        self._slots = weakref.WeakKeyDictionary()

    # -- one request, retried ------------------------------------------------------------
    def _settle(
        self, what: str, policy: RetryPolicy, tries: int, outcome: httpx.Response | Exception
    ) -> httpx.Response | float:
        """After try ``tries`` of ``what``: the response to return, or the seconds to wait
        before the next try (logged). A connection failure on the last try raises.

        The one retry decision; ``_request`` and ``_arequest`` differ only in their I/O."""
        if isinstance(outcome, httpx.Response):
            if not is_retryable_status(outcome.status_code) or tries >= policy.attempts:
                return outcome
            delay = policy.delay(tries - 1, retry_after_seconds(outcome))
            why = f"HTTP {outcome.status_code}"
        else:
            if tries >= policy.attempts:
                cls = Timeout if isinstance(outcome, httpx.TimeoutException) else Unavailable
                raise cls(
                    f"gateway {self.base_url} not reached after {tries} tries: {outcome!r}"
                ) from outcome
            delay = policy.delay(tries - 1, None)
            why = repr(outcome)
        log.warning("%s %s: %s; retry %d in %.2fs", what, self.base_url, why, tries, delay)
        return delay

    def _request(
        self, method: str, path: str, policy: RetryPolicy, **kwargs: Any
    ) -> httpx.Response:
        client = self._sync_client()
        for tries in range(1, policy.attempts + 1):
            outcome: httpx.Response | Exception
            try:
                outcome = client.request(method, f"{self.base_url}{path}", **kwargs)
            except RETRY_EXCEPTIONS as exc:
                outcome = exc
            step = self._settle(f"{method} {path}", policy, tries, outcome)
            if isinstance(step, httpx.Response):
                return step
            time.sleep(step)
        raise AssertionError("unreachable")  # the loop returns or raises on its last try

    async def _arequest(
        self, method: str, path: str, policy: RetryPolicy, **kwargs: Any
    ) -> httpx.Response:
        client, slots = self._async_client()
        for tries in range(1, policy.attempts + 1):
            outcome: httpx.Response | Exception
            try:
                async with slots or contextlib.nullcontext():  # a place for this try only
                    outcome = await client.request(method, f"{self.base_url}{path}", **kwargs)
            except RETRY_EXCEPTIONS as exc:
                outcome = exc
            step = self._settle(f"{method} {path}", policy, tries, outcome)
            if isinstance(step, httpx.Response):
                return step
            await asyncio.sleep(step)
        raise AssertionError("unreachable")

    @staticmethod
    def _parse(model: type[Model], r: httpx.Response, ok: tuple[int, ...] = (200,)) -> Model:
        """The answer as ``model``; an error status raises its ``ArbiterError``, and an
        answer whose body is not a ``model`` raises ``BadResponse`` (never retried: the
        same request gets the same body, e.g. a proxy's HTML page)."""
        if r.status_code not in ok:
            raise from_response(r.status_code, r.content, source="gateway")
        try:
            return model.model_validate_json(r.content)
        except ValidationError as exc:
            where = f"HTTP {r.status_code} from gateway {r.request.url}"
            raise BadResponse(
                f"{where}: the body is not a {model.__name__}: {exc}"[:MAX_MESSAGE_CHARS]
            ) from exc

    # -- API -------------------------------------------------------------------------------
    def score(
        self,
        groups: Sequence[GroupArg],
        recipe: RecipeArg = "gsm8k",
        on_error: Literal["mask", "fail"] = "mask",
        *,
        idempotency_key: str | None = None,
    ) -> ScoreResponse:
        """Score rollout groups; raises ``ArbiterError`` (``.retryable``, ``.status``)."""
        body = score_body(groups, recipe, on_error)
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        r = self._request("POST", "/v1/score", self.retry, json=body, headers=headers)
        return self._parse(ScoreResponse, r)

    async def ascore(
        self,
        groups: Sequence[GroupArg],
        recipe: RecipeArg = "gsm8k",
        on_error: Literal["mask", "fail"] = "mask",
        *,
        idempotency_key: str | None = None,
    ) -> ScoreResponse:
        body = score_body(groups, recipe, on_error)
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        r = await self._arequest("POST", "/v1/score", self.retry, json=body, headers=headers)
        return self._parse(ScoreResponse, r)

    def recipes(self) -> list[RecipeInfo]:
        """The gateway's named recipes: fingerprints, weights, and whether each is
        ``available`` on this deployment (else the ``reason``)."""
        return self.recipe_list().recipes

    async def arecipes(self) -> list[RecipeInfo]:
        return (await self.arecipe_list()).recipes

    def recipe_list(self) -> RecipeList:
        """``GET /v1/recipes`` whole: the recipes and the components not configured."""
        r = self._request("GET", "/v1/recipes", self.retry)
        return self._parse(RecipeList, r)

    async def arecipe_list(self) -> RecipeList:
        r = await self._arequest("GET", "/v1/recipes", self.retry)
        return self._parse(RecipeList, r)

    def check_recipe(
        self, recipe: RecipeArg, *, unreachable: Literal["raise", "warn"] = "raise"
    ) -> None:
        """Raise unless the gateway can serve ``recipe`` (``recipe_problem``): one
        ``GET /v1/recipes``, for a start check before a long job.

        ``unreachable="warn"``: a gateway that still fails retryably after the retries
        (down, 5xx, 429) is logged and the check passes, for a job that rides out outages;
        a refusal (``NotConfigured``, an unknown recipe, a refused key) still raises."""
        try:
            listing = self.recipe_list()
        except ArbiterError as exc:
            self._unchecked(recipe, exc, unreachable)
            return
        problem = recipe_problem(listing, recipe)
        if problem is not None:
            raise problem

    async def acheck_recipe(
        self, recipe: RecipeArg, *, unreachable: Literal["raise", "warn"] = "raise"
    ) -> None:
        try:
            listing = await self.arecipe_list()
        except ArbiterError as exc:
            self._unchecked(recipe, exc, unreachable)
            return
        problem = recipe_problem(listing, recipe)
        if problem is not None:
            raise problem

    def _unchecked(self, recipe: RecipeArg, exc: ArbiterError, unreachable: str) -> None:
        if unreachable == "raise" or not exc.retryable:
            raise exc
        name = recipe if isinstance(recipe, str) else "(inline)"
        log.warning("could not check recipe %s at %s: %s", name, self.base_url, exc.message)

    def health(self) -> Readiness:
        """The gateway's ``/readyz`` (ready or not, with each check); one try, no retry.

        Raises ``ArbiterError`` (unavailable) when the gateway cannot be reached."""
        r = self._request("GET", "/readyz", NO_RETRY)
        return self._parse(Readiness, r, (200, 503))

    async def ahealth(self) -> Readiness:
        r = await self._arequest("GET", "/readyz", NO_RETRY)
        return self._parse(Readiness, r, (200, 503))


def trl_reward(*args: Any, **kwargs: Any) -> Callable[..., list[float | None]]:
    """Alias of ``arbiter.integrations.trl.trl_reward`` (kept for existing imports)."""
    from arbiter.integrations.trl import trl_reward as make

    return make(*args, **kwargs)
