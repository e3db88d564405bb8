"""Dynamic batching: coalesce texts from concurrent requests into one encode call.

Each request submits its texts as one job. A single collector task takes queued texts
until ``max_batch_texts`` are gathered or the oldest has waited ``max_wait_ms``, hands
the batch to ONE worker thread (the event loop never blocks on the model), and scatters
the rows back: every job gets exactly its own rows, in its own order. A job larger than
a batch is split across batches. While the worker encodes, new texts queue up and form
the next batch, so a busy service runs back-to-back full batches.

Fair across teams first, then across requests: a batch is filled round-robin, an equal
share (times the team's weight, ``EMBEDDING_TEAM_WEIGHTS``) from every team with texts
queued, and inside a team's share an equal share from each of its queued jobs; a team,
and a job, with texts left goes to the back of its line. So a request of 2,048 texts, or
one team's 70 requests sent at once, delays another team's request by at most the batch
being encoded (and the one being prepared), not by all of their own batches. The team
comes from the gateway's internal header (``common.fairness.team_of``). A job whose caller
went away (its request was cancelled) is dropped from the queue.

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
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from arbiter.errors import Unprocessable
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.embedding.encoder import Encoded

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


class QueueFull(Exception):
    """The backlog is past ``max_queued_texts``; the caller should retry later."""


@dataclass
class _Job:
    texts: list[str]
    future: asyncio.Future[Encoded]
    enqueued: float
    vectors: np.ndarray | None = None
    tokens: np.ndarray | None = None
    truncated: np.ndarray | None = None
    remaining: int = 0
    next_index: int = 0  # first text not yet taken into a batch


@dataclass
class _Batch:
    texts: list[str] = field(default_factory=list)
    # (job, first row in job, first row in batch, count)
    parts: list[tuple[_Job, int, int, int]] = field(default_factory=list)


class DynamicBatcher:
    def __init__(
        self,
        encode: EncodeFn,
        *,
        prepare: PrepareFn | None = None,
        max_batch_texts: int,
        max_wait_ms: float,
        max_queued_texts: int,
        team_weights: Mapping[str, int] | None = None,
    ):
        self._encode = encode
        self._prepare = prepare
        self.max_batch_texts = max_batch_texts
        self.max_wait = max_wait_ms / 1000.0
        self.max_queued_texts = max_queued_texts
        self._weights = dict(team_weights or {})
        # team -> its queued jobs; the dict's order is the turn order across teams
        self._teams: dict[str, deque[_Job]] = {}
        self._queued = 0
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
        for line in self._teams.values():
            for job in line:
                if not job.future.done():
                    job.future.set_exception(RuntimeError("embedding service shutting down"))
        self._teams.clear()
        self._worker.shutdown(wait=False, cancel_futures=True)
        if self._prep_worker is not None:
            self._prep_worker.shutdown(wait=False, cancel_futures=True)

    @property
    def queued(self) -> int:
        return self._queued

    async def embed(self, texts: list[str], team: str = "") -> Encoded:
        """Queue ``texts`` (in ``team``'s line) and wait for their rows (in order)."""
        if self._task is None or self._task.done():
            raise RuntimeError("batcher is not running")
        if self._queued + len(texts) > self.max_queued_texts:
            raise QueueFull(f"{self._queued} texts already queued")
        loop = asyncio.get_running_loop()
        job = _Job(texts, loop.create_future(), time.perf_counter(), remaining=len(texts))
        line = self._teams.get(team)
        if line is None:
            line = self._teams[team] = deque()
        line.append(job)
        self._queued += len(texts)
        QUEUED.set(self._queued)
        self._wakeup.set()
        return await job.future

    def _take(self, batch: _Batch) -> None:
        """Move queued texts into ``batch`` until it is full or the queue is empty: a share
        (by weight) from each team in turn; a team with texts left goes to the back."""
        cap, teams, weights = self.max_batch_texts, self._teams, self._weights
        while teams and len(batch.texts) < cap:
            names = list(teams)
            weight_left = sum(weights.get(n, 1) for n in names) if weights else len(names)
            for name in names:
                room = cap - len(batch.texts)
                if room <= 0:
                    break
                weight = weights.get(name, 1) if weights else 1
                share = max(1, room * weight // weight_left)
                weight_left -= weight
                line = teams.pop(name)
                self._take_jobs(line, len(batch.texts) + share, batch)
                if line:
                    teams[name] = line  # back of the line: the other teams go first
        QUEUED.set(self._queued)

    def _take_jobs(self, line: deque[_Job], cap: int, batch: _Batch) -> None:
        """Texts of one team's jobs into ``batch`` until it holds ``cap`` or the team has
        none left: an equal share from each job in turn; a job with texts left goes to
        the back of the team's line."""
        while line and len(batch.texts) < cap:
            in_line = len(line)
            for k in range(in_line):
                if len(batch.texts) >= cap:
                    break
                job = line.popleft()
                left = len(job.texts) - job.next_index
                if job.future.done():  # the caller went away (cancelled): skip its texts
                    self._queued -= left
                    continue
                take = min(left, max(1, (cap - len(batch.texts)) // (in_line - k)))
                start = job.next_index
                batch.parts.append((job, start, len(batch.texts), take))
                batch.texts.extend(job.texts[start : start + take])
                job.next_index += take
                self._queued -= take
                if job.next_index < len(job.texts):
                    line.append(job)

    async def _collect(self) -> _Batch:
        while not self._teams:
            self._wakeup.clear()
            await self._wakeup.wait()
        batch = _Batch()
        deadline = min(line[0].enqueued for line in self._teams.values()) + self.max_wait
        self._take(batch)
        while len(batch.texts) < self.max_batch_texts:
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
                    continue
                PREPARE_SECONDS.observe(time.perf_counter() - started)
                if running is not None:  # one forward at a time, batches in order
                    await running
                running = asyncio.create_task(self._forward(batch, prepared))
        finally:
            if running is not None:
                running.cancel()

    async def _forward(self, batch: _Batch, inputs: Any) -> None:
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
        ENCODE_SECONDS.observe(time.perf_counter() - started)
        TEXTS.inc(len(batch.texts))
        TOKENS.inc(int(result.tokens.sum()))
        TRUNCATED.inc(int(result.truncated.sum()))
        self._scatter(batch, result)

    async def _isolate(self, batch: _Batch, exc: Exception) -> None:
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
        failed: list[tuple[_Job, Exception]] = []
        for job in jobs:
            if job.future.done():
                continue
            alone = _Batch()
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
    def _set_error(job: _Job, exc: Exception) -> None:
        if not job.future.done():
            job.future.set_exception(exc)

    @staticmethod
    def _scatter(batch: _Batch, result: Encoded) -> None:
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
