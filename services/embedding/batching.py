"""Dynamic batching: coalesce texts from concurrent requests into one encode call.

Each request submits its texts as one job. A single collector task takes queued texts
until ``max_batch_texts`` texts or ``token_budget`` tokens are gathered or the oldest has
waited ``max_wait_ms``, hands
the batch to ONE worker thread (the event loop never blocks on the model), and scatters
the rows back: every job gets exactly its own rows, in its own order. A job larger than
a batch is split across batches. While the worker encodes, new texts queue up and form
the next batch, so a busy service runs back-to-back full batches.

Bounded and fair (``queue.py``): a batch holds at most ``max_batch_texts`` texts and
``token_budget`` tokens, counted when the request arrives (``count``, the model's Rust
tokenizer, on a thread), so a batch of long texts is a short batch of few texts; it is
filled by the one fair-share policy (``common.fairshare``), a text costing its tokens:
teams first, then a team's requests (weights: ``EMBEDDING_TEAM_WEIGHTS``). So a request
of 2,048 texts, or one team's 30 requests of 64 long texts sent at once, delays another
team's request by at most the batch being encoded and the one being prepared, each of
bounded tokens, not by all of their own batches. The team comes from the gateway's
internal header (``common.fairness.team_of``). A job whose caller went away (its request
was cancelled) leaves the queue at once.

Isolated: when a batch fails (a text the tokenizer refuses, a fault), each of its jobs is
encoded again on its own, so only the job that fails alone gets the error; when the
others then succeed, that job's error is a 422 (its input could not be embedded).

With a ``prepare`` step (tokenization, see ``Encoder.prepare``) the batcher pipelines:
batch k+1 is collected and prepared on a second thread while batch k's forward passes
run on the encode thread, so the model never waits for the tokenizer (on a GPU the
tokenizer is a large share of an encode call's time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from arbiter.errors import Unprocessable
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.embedding.encoder import Encoded
from arbiter.services.embedding.queue import Batch, Job, TextQueue

log = logging.getLogger("arbiter.embedding")
# A broken model fails every batch alike: one line (and traceback) per kind per 10 s.
FAILURES_LOG = ThrottledLog(log)

BATCH_TEXTS = Histogram(
    "arbiter_embedding_batch_texts",
    "Texts per coalesced encode call.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
)
BATCH_REQUESTS = Histogram(
    "arbiter_embedding_batch_requests",
    "Requests (jobs) contributing to one encode call.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
BATCH_TOKENS = Histogram(
    "arbiter_embedding_batch_tokens",
    "Tokens (counted on arrival) per coalesced encode call; bounded by the token budget.",
    buckets=(64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144),
)
QUEUE_WAIT = Histogram(
    "arbiter_embedding_queue_wait_seconds",
    "Time a request waited in the queue before (part of) it started encoding.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ENCODE_SECONDS = Histogram(
    "arbiter_embedding_encode_seconds",
    "Wall time of one encode call (the forward passes; tokenizing too without a prepare step).",
    buckets=_SECONDS,
)
PREPARE_SECONDS = Histogram(
    "arbiter_embedding_prepare_seconds",
    "Wall time of tokenizing one batch on the prepare thread (overlaps the encode thread).",
    buckets=_SECONDS,
)
TEXTS = Counter("arbiter_embedding_texts_total", "Texts embedded (rate() gives texts/s).")
TOKENS = Counter("arbiter_embedding_tokens_total", "Tokens embedded, after truncation.")
TRUNCATED = Counter("arbiter_embedding_truncated_total", "Texts cut to max_seq_length.")
QUEUED = Gauge("arbiter_embedding_queued_texts", "Texts waiting for a batch.")
ISOLATED = Counter(
    "arbiter_embedding_isolated_failures_total",
    "Requests that failed alone after their batch failed and each was encoded again on its own.",
)

EncodeFn = Callable[[Any], Encoded]  # texts → rows; or prepare()'s output → rows
PrepareFn = Callable[[list[str]], Any]
CountFn = Callable[[list[str]], np.ndarray]  # texts → (n,) tokens each


class QueueFull(Exception):
    """The backlog is past ``max_queued_texts``; the caller should retry later."""


class DynamicBatcher:
    def __init__(
        self,
        encode: EncodeFn,
        *,
        prepare: PrepareFn | None = None,
        count: CountFn | None = None,
        max_batch_texts: int,
        token_budget: int = 0,
        max_wait_ms: float,
        max_queued_texts: int,
        team_weights: Mapping[str, int] | None = None,
    ):
        """``count``: tokens per text, for ``token_budget`` (0: none); without it a text
        costs 1."""
        self._encode = encode
        self._prepare = prepare
        self._count = count
        self.max_batch_texts = max_batch_texts
        self.max_wait = max_wait_ms / 1000.0
        self.max_queued_texts = max_queued_texts
        self._queue = TextQueue(
            max_texts=max_batch_texts, max_tokens=token_budget, weights=team_weights
        )
        self._wakeup = asyncio.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")
        self._prep_worker = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare") if prepare else None
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="embedding-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for job in self._queue.drain():
            if not job.future.done():
                job.future.set_exception(RuntimeError("embedding service shutting down"))
        self._worker.shutdown(wait=False, cancel_futures=True)
        if self._prep_worker is not None:
            self._prep_worker.shutdown(wait=False, cancel_futures=True)

    @property
    def queued(self) -> int:
        return self._queue.queued

    async def embed(self, texts: list[str], team: str = "") -> Encoded:
        """Queue ``texts`` (in ``team``'s line) and wait for their rows (in order)."""
        if self._task is None or self._task.done():
            raise RuntimeError("batcher is not running")
        self._check_room(len(texts))
        loop = asyncio.get_running_loop()
        if self._count is None:
            costs = np.ones(len(texts), dtype=np.int64)
        else:  # the Rust tokenizer releases the GIL: off the event loop
            costs = await loop.run_in_executor(None, self._count, texts)
            self._check_room(len(texts))
        job = Job(
            texts, costs, loop.create_future(), time.perf_counter(), team, remaining=len(texts)
        )
        self._queue.push(job)
        QUEUED.set(self._queue.queued)
        self._wakeup.set()
        try:
            return await job.future
        except asyncio.CancelledError:  # the caller went away: its queued texts go too
            self._queue.cancel(job)
            QUEUED.set(self._queue.queued)
            raise

    def _check_room(self, n: int) -> None:
        if self._queue.queued + n > self.max_queued_texts:
            raise QueueFull(f"{self._queue.queued} texts already queued")

    def _take(self, batch: Batch) -> None:
        self._queue.fill(batch)
        QUEUED.set(self._queue.queued)

    async def _collect(self) -> Batch:
        while not self._queue:
            self._wakeup.clear()
            await self._wakeup.wait()
        batch = Batch()
        deadline = self._queue.since + self.max_wait
        self._take(batch)
        while not self._queue.full(batch):
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), left)
            self._take(batch)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        running: asyncio.Task[None] | None = None  # forward passes of the previous batch
        try:
            while True:
                batch = await self._collect()
                if not batch.texts:
                    continue
                started = time.perf_counter()
                for job, *_ in batch.parts:
                    QUEUE_WAIT.observe(started - job.enqueued)
                BATCH_TEXTS.observe(len(batch.texts))
                BATCH_TOKENS.observe(batch.tokens)
                BATCH_REQUESTS.observe(len({id(p[0]) for p in batch.parts}))
                if self._prep_worker is None or self._prepare is None:  # one step
                    await self._forward(batch, batch.texts)
                    continue
                try:
                    prepared = await loop.run_in_executor(
                        self._prep_worker, self._prepare, batch.texts
                    )
                except Exception as exc:
                    if running is not None:  # one forward at a time, batches in order
                        await running
                        running = None
                    await self._isolate(batch, exc)
                    self._queue.settle(batch)
                    continue
                PREPARE_SECONDS.observe(time.perf_counter() - started)
                if running is not None:  # one forward at a time, batches in order
                    await running
                running = asyncio.create_task(self._forward(batch, prepared))
        finally:
            if running is not None:
                running.cancel()

    async def _forward(self, batch: Batch, inputs: Any) -> None:
        """Run the encode step on the encode thread and hand every job its rows; a failure
        goes to the batch's callers, never out of here."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            result = await loop.run_in_executor(self._worker, self._encode, inputs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._isolate(batch, exc)
            return
        finally:
            self._queue.settle(batch)
        ENCODE_SECONDS.observe(time.perf_counter() - started)
        TEXTS.inc(len(batch.texts))
        TOKENS.inc(int(result.tokens.sum()))
        TRUNCATED.inc(int(result.truncated.sum()))
        self._scatter(batch, result)

    async def _isolate(self, batch: Batch, exc: Exception) -> None:
        """A batch failed: encode each of its jobs' texts on their own, so that only a job
        that fails alone gets an error (a 422 when others in the batch succeeded)."""
        jobs = list({id(job): job for job, *_ in batch.parts}.values())
        if len(jobs) == 1:
            FAILURES_LOG.error(
                "batch", "encode failed for a batch of %d texts", len(batch.texts), exc_info=exc
            )
            self._set_error(jobs[0], exc)
            return
        FAILURES_LOG.warning(
            "isolate", "encode failed for a batch of %d requests; encoding each alone", len(jobs)
        )
        failed: list[tuple[Job, Exception]] = []
        for job in jobs:
            if job.future.done():
                continue
            alone = Batch()
            for part_job, job_start, batch_start, count in batch.parts:
                if part_job is job:
                    alone.parts.append((job, job_start, len(alone.texts), count))
                    alone.texts.extend(batch.texts[batch_start : batch_start + count])
            try:
                self._scatter(alone, await self._encode_now(alone.texts))
            except Exception as exc_alone:
                failed.append((job, exc_alone))
        ISOLATED.inc(len(failed))
        for job, cause in failed:
            FAILURES_LOG.error(
                "alone", "encode failed for one request's %d texts", len(job.texts), exc_info=cause
            )
            if len(failed) < len(jobs):  # the others went through: this input is the cause
                self._set_error(job, Unprocessable(
                    f"input could not be embedded ({type(cause).__name__}: {cause})",
                    code="unembeddable_input",
                ))  # fmt: skip
            else:
                self._set_error(job, cause)

    async def _encode_now(self, texts: list[str]) -> Encoded:
        """Prepare (when there is a prepare step) and encode ``texts``, on the same threads."""
        loop = asyncio.get_running_loop()
        inputs: Any = texts
        if self._prep_worker is not None and self._prepare is not None:
            inputs = await loop.run_in_executor(self._prep_worker, self._prepare, texts)
        return await loop.run_in_executor(self._worker, self._encode, inputs)

    @staticmethod
    def _set_error(job: Job, exc: Exception) -> None:
        if not job.future.done():
            job.future.set_exception(exc)

    @staticmethod
    def _scatter(batch: Batch, result: Encoded) -> None:
        for job, job_start, batch_start, count in batch.parts:
            if job.future.done():
                continue
            if job.vectors is None:
                n = len(job.texts)
                job.vectors = np.empty((n, result.vectors.shape[1]), dtype=np.float32)
                job.tokens = np.zeros(n, dtype=np.int64)
                job.truncated = np.zeros(n, dtype=bool)
            assert job.tokens is not None and job.truncated is not None
            rows = slice(batch_start, batch_start + count)
            dest = slice(job_start, job_start + count)
            job.vectors[dest] = result.vectors[rows]
            job.tokens[dest] = result.tokens[rows]
            job.truncated[dest] = result.truncated[rows]
            job.remaining -= count
            if job.remaining == 0:
                job.future.set_result(Encoded(job.vectors, job.tokens, job.truncated))
