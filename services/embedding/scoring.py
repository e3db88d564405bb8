"""The work of the embedding service, importable without FastAPI.

Diversity of response i in a group: 1 − cos(e_i, m), with e_i the L2-normalised
embedding and m the mean of the group's e_i. Rules (README, section ``embedding``):

- A response that is empty or only whitespace is not embedded: score null, kind
  ``empty_response``, and it takes no part in the group's mean. (Embedding "" would put
  it far from the others and reward it as "diverse".)
- Fewer than two non-empty responses: those get null, kind ``group_too_small``.
- If m is the zero vector (embeddings cancel out exactly), every diversity is 1.0
  (cos with a zero vector taken as 0).
- ``group_minmax`` / ``group_zscore`` rescale the group's non-null values; when they are
  all equal (span or population std ≤ 1e-9) every value becomes 0.0.

Identical texts inside one request are embedded once.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any

import numpy as np

from arbiter.errors import NotFound, PayloadTooLarge, RateLimited, Unavailable
from arbiter.proto.components import (
    ComponentGroupResult,
    ComponentResponse,
    ComponentUsage,
)
from arbiter.proto.embedding import (
    DiversityNormalize,
    DiversityRequest,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
    ModelCard,
    ModelList,
)
from arbiter.proto.errors import ItemError
from arbiter.services.embedding.batching import DynamicBatcher, QueueFull
from arbiter.services.embedding.encoder import Encoded, Encoder
from arbiter.services.embedding.encoder_process import ProcessEncoder
from arbiter.services.embedding.settings import EmbeddingSettings

log = logging.getLogger("arbiter.embedding")

EPS = 1e-9


def diversity_scores(vectors: np.ndarray) -> np.ndarray:
    """(n, d) embeddings of one group → (n,) values 1 − cos(e_i, mean of normalised e)."""
    e = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(e, axis=1, keepdims=True)
    e = np.divide(e, norms, out=np.zeros_like(e), where=norms > 0)
    m = e.mean(axis=0)
    m_norm = float(np.linalg.norm(m))
    if m_norm <= EPS:
        return np.ones(len(e))
    cos = (e @ m) / m_norm
    return np.clip(1.0 - cos, 0.0, 2.0)


def normalize_scores(values: np.ndarray, mode: DiversityNormalize) -> np.ndarray:
    """Rescale one group's diversities; degenerate groups (all equal) give zeros."""
    v = np.asarray(values, dtype=np.float64)
    if mode == "none" or v.size == 0:
        return v
    if mode == "group_minmax":
        span = float(v.max() - v.min())
        return np.zeros_like(v) if span <= EPS else (v - v.min()) / span
    if mode == "group_zscore":
        std = float(v.std())
        return np.zeros_like(v) if std <= EPS else (v - v.mean()) / std
    raise ValueError(f"unknown normalize mode {mode!r}")


def _row(unique: dict[str, int], text: str) -> int | None:
    """Row of ``text`` among the request's distinct texts; None for an empty response."""
    return unique.setdefault(text, len(unique)) if text.strip() else None


def to_base64(row: np.ndarray) -> str:
    """OpenAI's base64 encoding: little-endian float32 bytes."""
    return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode("ascii")


class EmbeddingHandler:
    """Built once per process (lifespan): loads the model in the background, owns the batcher."""

    def __init__(self, settings: EmbeddingSettings):
        self.settings = settings
        self.encoder: Encoder | ProcessEncoder | None = None
        self.batcher: DynamicBatcher | None = None
        self.load_error: str | None = None
        self._load_task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        self._load_task = asyncio.create_task(self._load(), name="embedding-load")

    async def _load(self) -> None:
        def build() -> Encoder | ProcessEncoder:
            if self.settings.encode_worker == "process":
                return ProcessEncoder(self.settings)
            return Encoder(self.settings)

        try:
            encoder = await asyncio.to_thread(build)
        except Exception as exc:
            # Its text may name a path on this machine: callers and the unauthenticated
            # /readyz get the kind, the log gets the rest.
            self.load_error = type(exc).__name__
            log.exception("could not load embedding model %r", self.settings.model)
            return
        s = self.settings
        budget = s.token_budget(encoder.device)
        # Counting tokens on arrival is a second tokenization, the service's largest host cost
        # on a GPU (its ratio to raw encode fell from 0.81 to 0.60 on an H200). It pays only
        # where the budget can bind; elsewhere a text costs 1 and teams share by texts.
        binds = 0 < budget < s.max_batch_texts * encoder.max_seq_length
        # tokenizing batch k+1 (prepare) overlaps the forward passes of batch k
        batcher = DynamicBatcher(
            encoder.forward,
            prepare=encoder.prepare,
            count=encoder.count if binds else None,
            max_batch_texts=s.max_batch_texts,
            token_budget=budget if binds else 0,
            max_wait_ms=s.max_wait_ms,
            max_queued_texts=s.max_queued_texts,
            team_weights=s.team_weights,
        )
        batcher.start()
        self.encoder, self.batcher = encoder, batcher

    async def stop(self) -> None:
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        if self.batcher is not None:
            await self.batcher.stop()
        if isinstance(self.encoder, ProcessEncoder):
            await asyncio.to_thread(self.encoder.close)

    def readiness(self) -> dict[str, str]:
        if self.load_error:
            return {"model": f"failed to load ({self.load_error}); see the service's log"}
        if self.encoder is None or self.batcher is None:
            return {"model": f"loading {self.settings.model_name}"}
        if isinstance(self.encoder, ProcessEncoder) and not self.encoder.alive:
            return {"model": "encoder process exited"}
        return {"model": "ok"}

    async def _ready_batcher(self) -> DynamicBatcher:
        """The batcher; a request arriving during the model load waits for it."""
        if self.batcher is None and self._load_task is not None and self.load_error is None:
            await asyncio.shield(self._load_task)
        if self.batcher is None:
            raise Unavailable(
                f"embedding model not available: {self.load_error or 'not loaded'}",
                code="model_unavailable",
            )
        return self.batcher

    async def _embed(self, texts: list[str], team: str) -> Encoded:
        batcher = await self._ready_batcher()
        try:
            return await batcher.embed(texts, team)
        except QueueFull as exc:
            raise RateLimited(f"embedding queue full ({exc}); retry later") from exc

    def _check_size(self, n: int, param: str) -> None:
        if n > self.settings.max_inputs:
            raise PayloadTooLarge(
                f"{param}: {n} texts in one request, more than EMBEDDING_MAX_INPUTS="
                f"{self.settings.max_inputs}; split the request",
                param=param,
                code="too_many_items",
            )

    # -- endpoints -------------------------------------------------------------------
    async def diversity(self, request: DiversityRequest, team: str = "") -> ComponentResponse:
        """``team`` (the gateway's internal header): whose fair share of the batches."""
        start = time.perf_counter()
        self._check_size(sum(len(g.responses) for g in request.groups), "groups")
        unique: dict[str, int] = {}
        rows: list[list[int | None]] = []  # per group, per response: row in `unique` or None
        for group in request.groups:
            rows.append([_row(unique, r) for r in group.responses])
        encoded = await self._embed(list(unique), team) if unique else None
        results = [
            self._group_result(group.id, group_rows, encoded, request.params.normalize)
            for group, group_rows in zip(request.groups, rows, strict=True)
        ]
        usage = ComponentUsage(
            items=sum(len(r) for r in rows),
            elapsed_ms=(time.perf_counter() - start) * 1000.0,
            prompt_tokens=int(encoded.tokens.sum()) if encoded is not None else 0,
        )
        return ComponentResponse(component="diversity", groups=results, usage=usage)

    @staticmethod
    def _group_result(
        group_id: str,
        rows: list[int | None],
        encoded: Encoded | None,
        normalize: DiversityNormalize,
    ) -> ComponentGroupResult:
        scores: list[float | None] = [None] * len(rows)
        errors: list[ItemError] = []
        kept = [(i, r) for i, r in enumerate(rows) if r is not None]  # (index, row)
        for i, r in enumerate(rows):
            if r is None:
                errors.append(ItemError(index=i, kind="empty_response", message="nothing to embed"))
        truncated: list[int] = []
        if encoded is not None:
            truncated = [i for i, r in kept if encoded.truncated[r]]
        if len(kept) < 2:
            for i, _ in kept:
                errors.append(
                    ItemError(
                        index=i,
                        kind="group_too_small",
                        message=f"diversity needs ≥ 2 non-empty responses, group has {len(kept)}",
                    )
                )
        else:
            assert encoded is not None
            vectors = encoded.vectors[[r for _, r in kept]]
            values = normalize_scores(diversity_scores(vectors), normalize)
            for (i, _), v in zip(kept, values, strict=True):
                scores[i] = float(v)
        errors.sort(key=lambda e: e.index)
        info: dict[str, Any] = {"truncated": truncated}
        return ComponentGroupResult(id=group_id, scores=scores, errors=errors, info=info)

    def models(self) -> ModelList:
        encoder = self.encoder
        if encoder is None:
            raise Unavailable(f"embedding model not loaded yet: {self.readiness()['model']}")
        card = ModelCard(
            id=self.settings.model_name,
            dimensions=encoder.dim,
            max_seq_length=encoder.max_seq_length,
        )
        return ModelList(data=[card])

    async def embeddings(self, request: EmbeddingRequest, team: str = "") -> EmbeddingResponse:
        if request.model not in (self.settings.model_name, self.settings.model):
            raise NotFound(
                f"model {request.model!r} is not served here; use {self.settings.model_name!r}",
                param="model",
                code="model_not_found",
            )
        texts = request.input
        self._check_size(len(texts), "input")
        encoded = await self._embed(texts, team)
        if request.encoding_format == "base64":
            data = [
                EmbeddingData(index=i, embedding=to_base64(row))
                for i, row in enumerate(encoded.vectors)
            ]
        else:
            data = [
                EmbeddingData(index=i, embedding=row)
                for i, row in enumerate(encoded.vectors.tolist())
            ]
        tokens = int(encoded.tokens.sum())
        return EmbeddingResponse(
            data=data,
            model=self.settings.model_name,
            usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
            truncated=[int(i) for i in np.flatnonzero(encoded.truncated)],
        )
