"""Gateway app factory; run it with ``arbiter serve gateway``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.middleware import Middleware

from arbiter.services.common.app import (
    TimingMiddleware,
    create_service_app,
    field_path,
    validation_response,
)
from arbiter.services.gateway import grader_api
from arbiter.services.gateway.auth import AuthMiddleware, KeyStore
from arbiter.services.gateway.collector import GroupCollector
from arbiter.services.gateway.compat import router as compat_router
from arbiter.services.gateway.envs_proxy import EnvsProxy
from arbiter.services.gateway.lifecycle import Lifecycle
from arbiter.services.gateway.nemo_envs import router as nemo_envs_router
from arbiter.services.gateway.ors import OneLeadingSlash, prefixed_router
from arbiter.services.gateway.ors import router as ors_router
from arbiter.services.gateway.ors_batch import router as ors_batch_router
from arbiter.services.gateway.routes import AUTH_RESPONSES, router
from arbiter.services.gateway.settings import GatewaySettings, get_settings
from arbiter.services.gateway.teams import Teams
from arbiter.services.scoring.cache import Cache, LRUCache, NullCache, RedisCache
from arbiter.services.scoring.fanout import ComponentClient
from arbiter.services.scoring.recipes import RecipeBook
from arbiter.services.scoring.scoring import Scorer

log = logging.getLogger("arbiter.gateway")

# Logged at start-up without a keys file (one line: the log formatter escapes newlines).
AUTH_OFF_BANNER = (
    "***** AUTH IS OFF ***** no GATEWAY_KEYS_FILE: every caller is team `anonymous`, with no "
    "key, quota or usage ledger. Fine on 127.0.0.1 (docker compose publishes the gateway "
    "there by default); before anyone else can reach this port, turn auth on: "
    "GATEWAY_KEYS_FILE (docker compose: /etc/arbiter/keys/keys.yaml) and a random "
    "GATEWAY_KEY_SECRET (docs/deploy/compose.md, docs/operations/teams.md)."
)


def build_cache(settings: GatewaySettings) -> Cache:
    if not settings.cache_enabled:
        return NullCache()
    if settings.redis_url:
        return RedisCache(
            settings.redis_url,
            ttl_s=settings.cache_ttl_s,
            timeout_s=settings.redis_timeout_s,
            max_connections=settings.redis_max_connections,
            retry_s=settings.redis_retry_s,
        )
    return LRUCache(settings.cache_lru_size, settings.cache_ttl_s)


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or get_settings()
    book = RecipeBook(settings.recipes_file)  # a bad recipes file fails here, at start-up
    keys = None  # likewise a bad keys file
    if settings.keys_file is not None:
        secret = settings.key_secret.get_secret_value()
        keys = KeyStore(settings.keys_file, secret, settings.keys_reload_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cache = build_cache(settings)
        client = ComponentClient(settings.components())
        scorer = Scorer(cache, client)
        teams = Teams(settings, keys)
        app.state.settings = settings
        app.state.scorer = scorer
        app.state.teams = teams
        lifecycle = Lifecycle(book, scorer, teams, settings.team_weights)
        app.state.lifecycle = lifecycle
        envs = app.state.envs = EnvsProxy(settings, teams)  # /ors and /nemo-gym/envs
        app.state.compat_collector = GroupCollector(
            scorer, settings.compat_window_ms / 1000, settings.compat_max_group
        )
        log.info(
            "gateway: cache=%s verify=%s embedding=%s judge=%s recipes=%s auth=%s",
            cache.kind, settings.verify_url, settings.embedding_url, settings.judge_url,
            ", ".join(book.names - {"inline"}),
            f"on ({settings.keys_file})" if keys else "off (no GATEWAY_KEYS_FILE)",
        )  # fmt: skip
        if keys is None:
            log.warning(AUTH_OFF_BANNER)
        try:
            yield
        finally:
            await lifecycle.close()
            await envs.close()
            await client.close()
            await cache.close()
            await teams.close()

    async def ready(app: FastAPI) -> dict[str, str]:
        scorer: Scorer = app.state.scorer
        return await scorer.ready()

    app = create_service_app(
        service="gateway",
        title="Arbiter gateway",
        description="Rewards for GRPO rollout groups: recipes of components behind one API.",
        router=router,
        lifespan=lifespan,
        ready=ready,
        settings=settings,
    )
    app.include_router(compat_router, responses=AUTH_RESPONSES)  # other frameworks' shapes
    app.include_router(ors_batch_router)  # many episodes' calls in one request
    app.include_router(nemo_envs_router)  # environments as NeMo Gym resources servers
    # the same over the Open Reward Standard, at the root (ORS clients drop a base URL's
    # path) and under /ors; last, so the gateway's own paths are matched first
    app.include_router(prefixed_router)
    app.include_router(ors_router)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    # Keys are checked right inside the timing middleware (401s are timed), before the
    # limits middleware reads a byte of the body.
    timing = next(i for i, m in enumerate(app.user_middleware) if m.cls is TimingMiddleware)
    app.user_middleware.insert(timing + 1, Middleware(AuthMiddleware, store=keys))
    app.add_middleware(OneLeadingSlash)
    return app


def _first_error(errors: list[dict[str, Any]]) -> tuple[str, str]:
    """(param, message) of the error to report, with pydantic's union tags taken out.

    ``recipe`` is ``str | Recipe``: pydantic reports both branches (``recipe.str``,
    ``recipe.Recipe.components.0.weight``); keep the branch the caller meant (an object
    means an inline recipe) and name the field without the tag.
    """
    picked: list[tuple[list[Any], str]] = []
    recipe_input: Any = None
    for err in errors:
        loc = field_path(err.get("loc", ()))
        if loc[:2] == ["recipe", "str"]:
            recipe_input = err.get("input")
        picked.append((loc, str(err.get("msg", "invalid"))))
    cleaned = []
    for loc, msg in picked:
        if loc[:2] == ["recipe", "str"]:
            if isinstance(recipe_input, dict):
                continue
            loc, msg = ["recipe"], "give a recipe name (string) or an inline recipe object"
        elif loc[:2] == ["recipe", "Recipe"]:
            if not isinstance(recipe_input, dict) and recipe_input is not None:
                continue
            loc = ["recipe", *loc[2:]]
        cleaned.append((loc, msg))
    loc, msg = cleaned[0] if cleaned else picked[0]
    return ".".join(str(p) for p in loc), msg


async def _validation_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_response(grader_api.untagged(exc), pick=_first_error)
