"""Gateway app factory; run it with ``arbiter serve gateway``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from arbiter.services.common.app import create_service_app, validation_response
from arbiter.services.gateway.cache import Cache, LRUCache, NullCache, RedisCache
from arbiter.services.gateway.compat import router as compat_router
from arbiter.services.gateway.fanout import ComponentClient
from arbiter.services.gateway.recipes import RecipeBook
from arbiter.services.gateway.routes import router
from arbiter.services.gateway.scoring import Scorer
from arbiter.services.gateway.settings import GatewaySettings, get_settings

log = logging.getLogger("arbiter.gateway")


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

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cache = build_cache(settings)
        client = ComponentClient(settings)
        app.state.scorer = Scorer(book, cache, client, enabled=settings.cache_enabled)
        log.info(
            "gateway: cache=%s verify=%s embedding=%s judge=%s recipes=%s",
            cache.kind, settings.verify_url, settings.embedding_url, settings.judge_url,
            ", ".join(book.names - {"inline"}),
        )  # fmt: skip
        try:
            yield
        finally:
            await client.close()
            await cache.close()

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
    app.include_router(compat_router)  # /v1/compat/*: other frameworks' shapes
    app.add_exception_handler(RequestValidationError, _validation_handler)
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
        loc = [p for p in err.get("loc", ()) if p not in ("body", "query", "path")]
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
    return validation_response(exc, pick=_first_error)
