"""The dynamic batcher's bookkeeping, in-process, with a deterministic stand-in encoder.

The real model is exercised over HTTP in test_service.py; here a pure function (text →
its own fixed vector) makes every row checkable and the batch boundaries observable.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib

import numpy as np
import pytest

from arbiter.errors import Unprocessable
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


async def test_failed_batch_is_retried_job_by_job() -> None:
    # A stand-in that raises once: a model fault cannot be provoked on demand otherwise.
    # The batch of two requests fails; each is encoded again on its own and succeeds.
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
        a, b = await asyncio.gather(batcher.embed(["a"]), batcher.embed(["b"]))
        np.testing.assert_array_equal(a.vectors[0], vector_of("a"))
        np.testing.assert_array_equal(b.vectors[0], vector_of("b"))
        assert good.batches == [["a"], ["b"]]  # after the failed ["a", "b"]
    finally:
        await batcher.stop()


async def test_encode_failure_reaches_every_caller_and_the_batcher_survives() -> None:
    # A stand-in for a model that is broken for a while (every call fails), then recovers.
    calls = {"n": 0}
    good = RecordingEncoder()

    def broken(texts: list[str]) -> Encoded:
        calls["n"] += 1
        if calls["n"] <= 3:  # the batch, then each of its two requests alone
            raise RuntimeError("CUDA error: device-side assert")
        return good(texts)

    batcher = DynamicBatcher(broken, max_batch_texts=64, max_wait_ms=20.0, max_queued_texts=100)
    batcher.start()
    try:
        first = await asyncio.gather(
            batcher.embed(["a"]), batcher.embed(["b"]), return_exceptions=True
        )
        assert all(isinstance(r, RuntimeError) for r in first), first  # not a 422: all failed
        again = await batcher.embed(["c"])  # the next batch is served normally
        np.testing.assert_array_equal(again.vectors[0], vector_of("c"))
    finally:
        await batcher.stop()


async def test_one_bad_input_fails_only_its_own_request() -> None:
    # A stand-in tokenizer that refuses one text, as a real one refuses input it cannot
    # encode (the service refuses lone surrogates before any work, so they cannot be the
    # example here). 16 good requests batched with the bad one all get their rows.
    encoder = RecordingEncoder()

    def picky(texts: list[str]) -> Encoded:
        if "poison" in texts:
            raise ValueError("tokenizer: cannot encode this text")
        return encoder(texts)

    batcher = DynamicBatcher(picky, max_batch_texts=64, max_wait_ms=20.0, max_queued_texts=1000)
    batcher.start()
    try:
        jobs = [[f"req {j} text {k}" for k in range(5)] for j in range(16)]
        jobs.insert(7, ["fine", "poison", "fine too"])
        results = await asyncio.gather(*(batcher.embed(t) for t in jobs), return_exceptions=True)
    finally:
        await batcher.stop()
    bad = results.pop(7)
    assert isinstance(bad, Unprocessable) and bad.status == 422, bad
    assert "could not be embedded" in bad.message
    for texts, got in zip(jobs[:7] + jobs[8:], results, strict=True):
        assert isinstance(got, Encoded), got
        np.testing.assert_array_equal(got.vectors, np.stack([vector_of(t) for t in texts]))


async def test_small_request_not_held_behind_a_large_one() -> None:
    # Fairness: a request of 8 texts arriving behind one of 640 shares the next batch with
    # it (an equal share each), instead of waiting for the large one's ten batches.
    encoder = RecordingEncoder()
    batcher = await run_batcher(encoder, max_batch_texts=64, max_wait_ms=1.0)
    try:
        large = asyncio.ensure_future(batcher.embed([f"large {k}" for k in range(640)]))
        await asyncio.sleep(0)  # queued first
        small = await batcher.embed([f"small {k}" for k in range(8)])
        assert not large.done()
        await large
    finally:
        await batcher.stop()
    np.testing.assert_array_equal(small.vectors[0], vector_of("small 0"))
    first_with_small = next(i for i, b in enumerate(encoder.batches) if "small 0" in b)
    assert first_with_small <= 1, [len(b) for b in encoder.batches]
    assert all(len(b) <= 64 for b in encoder.batches)


class SlowEncoder(RecordingEncoder):
    """10 ms per encode call (on the encode thread), so a flood takes many batches' time."""

    def __call__(self, texts: list[str]) -> Encoded:
        time.sleep(0.01)
        return super().__call__(texts)


@pytest.mark.parametrize("prepare", [False, True])
async def test_another_team_is_in_the_next_batch_whatever_one_team_sent(prepare: bool) -> None:
    # Team a sends 70 requests of 6 texts at once (one sample per POST, as OpenRLHF and
    # slime send); team b's 1-text request, sent while a's batches run, is in the next
    # batch that starts (the one after it, with a prepare step that already holds the
    # next batch): counted in batches started between b's send and b's own. Shared per
    # request only, it waited for a share of every one of a's 70 requests first (5
    # batches of 16 here).
    encoder = SlowEncoder()
    if prepare:
        batcher = DynamicBatcher(encoder, prepare=lambda texts: texts, max_batch_texts=16,
                                 max_wait_ms=1.0, max_queued_texts=10_000)  # fmt: skip
        batcher.start()
    else:
        batcher = await run_batcher(encoder, max_batch_texts=16, max_wait_ms=1.0)
    try:
        flood = [
            asyncio.ensure_future(batcher.embed([f"a{r} {k}" for k in range(6)], team="a"))
            for r in range(70)
        ]
        for _ in range(2000):  # until a's batches are running
            if len(encoder.batches) >= 3:
                break
            await asyncio.sleep(0.005)
        started = len(encoder.batches)
        small = await batcher.embed(["b 0"], team="b")
        np.testing.assert_array_equal(small.vectors[0], vector_of("b 0"))
        first_with_b = next(i for i, b in enumerate(encoder.batches) if "b 0" in b)
        assert first_with_b - started <= (2 if prepare else 1), (first_with_b, started)
        assert not all(f.done() for f in flood)
        await asyncio.gather(*flood)
    finally:
        await batcher.stop()


async def test_weighted_team_gets_its_share_of_each_batch() -> None:
    # EMBEDDING_TEAM_WEIGHTS={"a": 3}: with both teams queued, a batch of 16 holds 12 of
    # a's texts and 4 of b's.
    encoder = RecordingEncoder()
    batcher = DynamicBatcher(encoder, max_batch_texts=16, max_wait_ms=50.0,
                             max_queued_texts=1000, team_weights={"a": 3})  # fmt: skip
    batcher.start()
    try:
        await asyncio.gather(
            batcher.embed([f"a {k}" for k in range(64)], team="a"),
            batcher.embed([f"b {k}" for k in range(64)], team="b"),
        )
    finally:
        await batcher.stop()
    first = encoder.batches[0]
    assert (sum(t[0] == "a" for t in first), sum(t[0] == "b" for t in first)) == (12, 4)


async def test_cancelled_request_texts_are_not_encoded() -> None:
    # A caller that goes away (its task cancelled, as when its client disconnects) takes
    # its queued texts with it.
    encoder = RecordingEncoder()
    batcher = await run_batcher(encoder, max_batch_texts=4, max_wait_ms=1.0)
    try:
        gone = asyncio.ensure_future(batcher.embed([f"gone {k}" for k in range(400)]))
        await asyncio.sleep(0)
        gone.cancel()
        kept = await batcher.embed(["kept"])
    finally:
        await batcher.stop()
    np.testing.assert_array_equal(kept.vectors[0], vector_of("kept"))
    encoded = [t for b in encoder.batches for t in b]
    assert sum(t.startswith("gone") for t in encoded) <= 4  # at most the batch in flight
    assert batcher.queued == 0


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
    # every prepared batch was encoded once; every text once, each job's in its order
    assert encoder.prepared == len(encoder.batches)
    encoded = [t for b in encoder.batches for t in b]
    assert sorted(encoded) == sorted(t for j in jobs for t in j)
    for texts in jobs:
        assert [t for t in encoded if t in set(texts)] == texts


async def test_prepare_failure_reaches_its_callers_and_the_batcher_survives() -> None:
    # A tokenizer fault cannot be provoked on demand with a real model: a stand-in raises
    # for the batch and for each of its requests encoded alone.
    encoder = PreparingEncoder()
    calls = {"n": 0}

    def flaky_prepare(texts: list[str]) -> tuple[int, list[str]]:
        calls["n"] += 1
        if calls["n"] <= 3:  # the batch, then each of its two requests alone
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


async def test_a_broken_model_logs_once_per_interval_not_per_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A stand-in for a model broken for good (a fault not caused on demand otherwise):
    # every batch fails alike, and the log gets at most one line per kind per 10 s.
    def broken(texts: list[str]) -> Encoded:
        raise RuntimeError("CUDA error: device-side assert")

    batcher = DynamicBatcher(broken, max_batch_texts=64, max_wait_ms=1.0, max_queued_texts=100)
    batcher.start()
    try:
        with caplog.at_level(logging.WARNING, logger="arbiter.embedding"):
            for k in range(10):
                with pytest.raises(RuntimeError):
                    await batcher.embed([f"t{k}"])
    finally:
        await batcher.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("encode failed for a batch") for m in lines) <= 1, lines
