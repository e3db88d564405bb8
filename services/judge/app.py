"""Judge app factory; run it with ``arbiter serve judge``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from arbiter.services.common.app import create_service_app
from arbiter.services.judge.routes import router
from arbiter.services.judge.scoring import Judge
from arbiter.services.judge.settings import JudgeSettings, get_settings

log = logging.getLogger("arbiter.judge")


def create_app(settings: JudgeSettings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.judge = Judge(settings)
        log.info("judge: %s model=%s", settings.base_url, settings.model or "(first listed)")
        try:
            yield
        finally:
            await app.state.judge.aclose()

    async def ready(app: FastAPI) -> dict[str, str]:
        judge: Judge = app.state.judge
        return await judge.readiness()

    return create_service_app(
        service="judge",
        title="Arbiter judge",
        description="LLM-as-judge rewards through an OpenAI-compatible server (vLLM).",
        router=router,
        lifespan=lifespan,
        ready=ready,
        settings=settings,
    )
