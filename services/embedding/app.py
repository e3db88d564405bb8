"""Embedding service app factory; run it with ``arbiter serve embedding``.

The model loads in the background: ``/healthz`` answers at once, ``/readyz`` turns 200
when the model is loaded (or says why not), and a request that arrives during the load
waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from arbiter.services.common.app import create_service_app
from arbiter.services.embedding.routes import router
from arbiter.services.embedding.scoring import EmbeddingHandler
from arbiter.services.embedding.settings import EmbeddingSettings, get_settings

log = logging.getLogger("arbiter.embedding")


def create_app(settings: EmbeddingSettings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        handler = EmbeddingHandler(settings)
        await handler.start()
        app.state.embedding = handler
        log.info("embedding: loading %s (device %s, %s)", settings.model, settings.device,
                 settings.dtype)  # fmt: skip
        try:
            yield
        finally:
            await handler.stop()

    async def ready(app: FastAPI) -> dict[str, str]:
        handler: EmbeddingHandler | None = getattr(app.state, "embedding", None)
        if handler is None:
            return {"model": "starting"}
        return handler.readiness()

    return create_service_app(
        service="embedding",
        title="Arbiter embedding",
        description="diversity (group-level, dynamic batching) and OpenAI-compatible embeddings.",
        router=router,
        lifespan=lifespan,
        ready=ready,
        settings=settings,
    )
