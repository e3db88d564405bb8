"""Envs service app factory; run it with ``arbiter serve envs``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from arbiter.services.common.app import create_service_app
from arbiter.services.envs.batch_routes import router as batch_router
from arbiter.services.envs.rewards import Rewards
from arbiter.services.envs.routes import router
from arbiter.services.envs.serving import Envs
from arbiter.services.envs.settings import EnvsSettings, get_settings
from arbiter.services.envs.store import Store

log = logging.getLogger("arbiter.envs")


def create_app(settings: EnvsSettings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.state_redis_url, settings.session_ttl_s, settings.team_episode_bytes)
        rewards = Rewards(settings)
        try:
            app.state.envs = Envs(settings, store, rewards)  # tasks read here, once
            log.info(
                "envs ready: %s; episodes idle %d s at most",
                ", ".join(app.state.envs.names()),
                settings.session_ttl_s,
            )
            yield
        finally:
            await rewards.close()
            await store.close()

    async def ready(app: FastAPI) -> dict[str, str]:
        envs: Envs | None = getattr(app.state, "envs", None)
        if envs is None:
            return {"envs": "starting"}
        return {"state": await envs.store.check(), "gsm8k": envs.gsm8k_check}

    app = create_service_app(
        service="envs",
        title="Arbiter envs",
        description="Multi-turn episodes over the Open Reward Standard; tools run in the "
        "sandbox, rewards come from the components /v1/score uses.",
        router=router,
        lifespan=lifespan,
        ready=ready,
        settings=settings,
    )
    app.include_router(batch_router)  # many episodes' calls in one request (batch.py)
    return app
