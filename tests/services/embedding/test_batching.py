"""The dynamic batcher's bookkeeping, in-process, with a deterministic stand-in encoder.

The real model is exercised over HTTP in test_service.py; here a pure function (text →
its own fixed vector) makes every row checkable and the batch boundaries observable.
"""

from __future__ import annotations

import asyncio
import zlib

import numpy as np
import pytest

from arbiter.services.embedding.batching import DynamicBatcher, QueueFull
from arbiter.services.embedding.encoder import Encoded


def vector_of(text: str) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(text.encode()))
    return rng.normal(size=8).astype(np.float32)


class RecordingEncoder:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def __call__(self, texts: list[str]) -> Encoded:
        self.batches.append(list(texts))
        vectors = np.stack([vector_of(t) for t in texts])
        tokens = np.array([len(t) for t in texts])
        return Encoded(vectors, tokens, tokens > 20)


async def run_batcher(encoder: RecordingEncoder, **kwargs: float) -> DynamicBatcher:
    opts = {"max_batch_texts": 16, "max_wait_ms": 20.0, "max_queued_texts": 10_000, **kwargs}
    batcher = DynamicBatcher(encoder, **opts)  # type: ignore[arg-type]
    batcher.start()
    return batcher


async def test_concurrent_jobs_get_their_own_rows() -> None:
    encoder = RecordingEncoder()
    batcher = await run_batcher(encoder)
    try:
        jobs = [[f"job {j} text {k}" for k in range(1 + j % 5)] for j in range(40)]
        results = await asyncio.gather(*(batcher.embed(texts) for texts in jobs))
    finally:
        await batcher.stop()
    for texts, got in zip(jobs, results, strict=True):
        np.testing.assert_array_equal(got.vectors, np.stack([vector_of(t) for t in texts]))
        np.testing.assert_array_equal(got.tokens, [len(t) for t in texts])
    # texts were coalesced: fewer encode calls than jobs, none over the limit
    assert len(encoder.batches) < len(jobs)
    assert max(len(b) for b in encoder.batches) <= 16


async def test_job_larger_than_a_batch_is_split_and_reassembled() -> None:
    encoder = RecordingEncoder()
    batcher = await run_batcher(encoder, max_batch_texts=4)
    try:
        texts = [f"long job {k} " + "x" * k for k in range(11)]
        got = await batcher.embed(texts)
    finally:
        await batcher.stop()
    assert [len(b) for b in encoder.batches] == [4, 4, 3]
    np.testing.assert_array_equal(got.vectors, np.stack([vector_of(t) for t in texts]))
    np.testing.assert_array_equal(got.truncated, [len(t) > 20 for t in texts])


async def test_encode_failure_reaches_every_caller_and_the_batcher_survives() -> None:
    # A stand-in that raises once: a model fault cannot be provoked on demand otherwise.
    calls = {"n": 0}
    good = RecordingEncoder()

    def flaky(texts: list[str]) -> Encoded:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA error: out of memory")
        return good(texts)

    batcher = DynamicBatcher(flaky, max_batch_texts=64, max_wait_ms=20.0, max_queued_texts=100)
    batcher.start()
    try:
        first = await asyncio.gather(
            batcher.embed(["a"]), batcher.embed(["b"]), return_exceptions=True
        )
        assert all(isinstance(r, RuntimeError) for r in first)
        again = await batcher.embed(["c"])  # the next batch is served normally
        np.testing.assert_array_equal(again.vectors[0], vector_of("c"))
    finally:
        await batcher.stop()


async def test_backlog_over_the_limit_is_refused() -> None:
    batcher = await run_batcher(RecordingEncoder(), max_queued_texts=5)
    try:
        with pytest.raises(QueueFull):
            await batcher.embed([str(k) for k in range(6)])
    finally:
        await batcher.stop()


class PreparingEncoder(RecordingEncoder):
    """prepare() tags a batch; forward() checks it got exactly that batch back."""

    def __init__(self) -> None:
        super().__init__()
        self.prepared = 0

    def prepare(self, texts: list[str]) -> tuple[int, list[str]]:
        self.prepared += 1
        return self.prepared, list(texts)

    def forward(self, prepared: tuple[int, list[str]]) -> Encoded:
        return self(prepared[1])


async def test_prepare_step_is_pipelined_and_rows_stay_with_their_callers() -> None:
    encoder = PreparingEncoder()
    batcher = DynamicBatcher(
        encoder.forward, prepare=encoder.prepare,
        max_batch_texts=8, max_wait_ms=5.0, max_queued_texts=10_000,
    )  # fmt: skip
    batcher.start()
    try:
        jobs = [[f"p {j} {k}" for k in range(1 + j % 7)] for j in range(60)]
        results = await asyncio.gather(*(batcher.embed(texts) for texts in jobs))
    finally:
        await batcher.stop()
    for texts, got in zip(jobs, results, strict=True):
        np.testing.assert_array_equal(got.vectors, np.stack([vector_of(t) for t in texts]))
    # every prepared batch was encoded once, in queue order
    assert encoder.prepared == len(encoder.batches)
    assert [t for b in encoder.batches for t in b] == [t for j in jobs for t in j]


async def test_prepare_failure_reaches_its_callers_and_the_batcher_survives() -> None:
    # A tokenizer fault cannot be provoked on demand with a real model: a stand-in raises once.
    encoder = PreparingEncoder()
    calls = {"n": 0}

    def flaky_prepare(texts: list[str]) -> tuple[int, list[str]]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("tokenizer exploded")
        return encoder.prepare(texts)

    batcher = DynamicBatcher(
        encoder.forward, prepare=flaky_prepare,
        max_batch_texts=64, max_wait_ms=20.0, max_queued_texts=100,
    )  # fmt: skip
    batcher.start()
    try:
        first = await asyncio.gather(
            batcher.embed(["a"]), batcher.embed(["b"]), return_exceptions=True
        )
        assert all(isinstance(r, ValueError) for r in first)
        again = await batcher.embed(["c"])
        np.testing.assert_array_equal(again.vectors[0], vector_of("c"))
    finally:
        await batcher.stop()
