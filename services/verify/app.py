"""Verify service app factory; run it with ``arbiter serve verify``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from arbiter.services.common.app import create_service_app
from arbiter.services.verify.routes import router
from arbiter.services.verify.scoring import Verifier
from arbiter.services.verify.settings import VerifySettings, get_settings

log = logging.getLogger("arbiter.verify")


def create_app(settings: VerifySettings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        verifier = Verifier(settings)
        await verifier.start()
        app.state.verifier = verifier
        log.info(
            "verify ready: %d workers, deadline %.1f s, math-verify timeout %d s",
            settings.workers,
            settings.deadline_s,
            settings.mv_timeout,
        )
        try:
            yield
        finally:
            await verifier.close()

    async def ready(app: FastAPI) -> dict[str, str]:
        verifier: Verifier | None = getattr(app.state, "verifier", None)
        if verifier is None:
            return {"pool": "starting"}
        return verifier.ready()

    return create_service_app(
        service="verify",
        title="Arbiter verify",
        description="math_accuracy (math-verify in a process pool) and format.",
        router=router,
        lifespan=lifespan,
        ready=ready,
        settings=settings,
    )
