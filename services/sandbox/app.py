"""Sandbox service app factory; run it with ``arbiter serve sandbox``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from arbiter.services.common.app import create_service_app
from arbiter.services.sandbox.routes import router
from arbiter.services.sandbox.scoring import Runner
from arbiter.services.sandbox.sessions import Sessions
from arbiter.services.sandbox.settings import SandboxSettings, get_settings

log = logging.getLogger("arbiter.sandbox")


def create_app(settings: SandboxSettings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runner = Runner(settings)
        await runner.start()  # one sandbox started and checked: a broken setup stops here
        app.state.runner = runner
        sessions = Sessions(settings, runner.pool, runner.slots)  # live Python interpreters
        await sessions.start()
        app.state.sessions = sessions
        log.info(
            "sandbox ready: %d workers, %s, %d MB a sandbox (%d MB a grader's), %g s per item",
            settings.workers,
            settings.python,
            settings.memory_mb,
            settings.grader_memory_mb,
            settings.item_timeout_s,
        )
        try:
            yield
        finally:
            await sessions.close()
            await runner.close()

    async def ready(app: FastAPI) -> dict[str, str]:
        runner: Runner | None = getattr(app.state, "runner", None)
        if runner is None:
            return {"sandbox": "starting"}
        return runner.ready()

    return create_service_app(
        service="sandbox",
        title="Arbiter sandbox",
        description="code_tests, python_grader and live Python interpreters: untrusted "
        "code under bubblewrap.",
        router=router,
        lifespan=lifespan,
        ready=ready,
        settings=settings,
    )
