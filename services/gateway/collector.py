"""Group-aware batching for the sample-level routes (OpenRLHF, slime, NeMo Gym).

Those frameworks post one sample per request, but GRPO's group components (``diversity``)
need the whole group. Samples are collected per key (recipe, prompt, reference): the first
sample of a key opens a batch and a window; the batch is scored as one group when the
window closes or when it holds ``group_size`` samples (the caller's, else
``GATEWAY_COMPAT_MAX_GROUP``), whichever comes first. Every waiter then gets its own
index of that group. A full batch closes at once and the next sample opens a new one, so a
batch never exceeds its size, and the window bounds the latency the collection adds.

A waiter whose client went away leaves its batch: before the batch is sent its sample is
dropped, and a batch whose every waiter left is not scored (or its scoring is cancelled).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client import Histogram

from arbiter.proto.gateway import ScoreRequest
from arbiter.services.gateway.scoring import Scorer

log = logging.getLogger("arbiter.gateway.compat")

GROUP_SIZE = Histogram(
    "arbiter_gateway_compat_group_size",
    "Samples scored together as one group by the sample-level (compat) routes.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)


class GroupKey(NamedTuple):
    recipe: str
    prompt: str
    reference: str | None
    team: str | None = None  # two teams' samples never land in one group (auth, usage, cache)


class SampleScore(NamedTuple):
    """One sample's share of its group's score."""

    reward: float | None
    components: dict[str, float | None]
    errors: list[dict[str, Any]]  # {"component", "index", "kind", "message"} of this sample
    fingerprint: str
    group_size: int


@dataclass
class _Batch:
    key: GroupKey
    size: int
    responses: list[str] = field(default_factory=list)
    waiters: list[asyncio.Future[SampleScore]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None
    sent: bool = False


class GroupCollector:
    """Built once per app; ``submit`` is called once per sample-level request."""

    def __init__(self, scorer: Scorer, window_s: float, max_group: int):
        self.scorer = scorer
        self.window_s = window_s
        self.max_group = max_group
        self._open: dict[GroupKey, _Batch] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def submit(
        self,
        key: GroupKey,
        response: str,
        *,
        window_s: float | None = None,
        group_size: int | None = None,
    ) -> SampleScore:
        batch = self._open.get(key)
        if batch is None:
            batch = _Batch(key, min(group_size or self.max_group, self.max_group))
            self._open[key] = batch
            wait = self.window_s if window_s is None else window_s
            batch.timer = asyncio.get_running_loop().call_later(wait, self._send, batch)
        waiter: asyncio.Future[SampleScore] = asyncio.get_running_loop().create_future()
        batch.responses.append(response)
        batch.waiters.append(waiter)
        if len(batch.responses) >= batch.size:
            self._send(batch)
        try:
            return await waiter
        except asyncio.CancelledError:
            self._leave(batch)
            raise

    def _leave(self, batch: _Batch) -> None:
        """A waiter was cancelled (client gone): stop work nobody waits for."""
        if batch.sent and batch.task is not None and all(w.done() for w in batch.waiters):
            batch.task.cancel()

    def _send(self, batch: _Batch) -> None:
        if batch.sent:
            return
        batch.sent = True
        if batch.timer is not None:
            batch.timer.cancel()
        if self._open.get(batch.key) is batch:
            del self._open[batch.key]
        live = [i for i, w in enumerate(batch.waiters) if not w.done()]
        if not live:
            return
        batch.task = asyncio.get_running_loop().create_task(self._score(batch, live))
        self._tasks.add(batch.task)
        batch.task.add_done_callback(self._tasks.discard)

    async def _score(self, batch: _Batch, live: list[int]) -> None:
        key = batch.key
        GROUP_SIZE.observe(len(live))
        request = ScoreRequest.model_validate(
            {
                "recipe": key.recipe,
                "groups": [
                    {
                        "prompt": key.prompt,
                        "reference": key.reference,
                        "responses": [batch.responses[i] for i in live],
                    }
                ],
            }
        )
        try:
            scored = await self.scorer.score(request, key.team)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every waiter answers with the same envelope
            for i in live:
                if not batch.waiters[i].done():
                    batch.waiters[i].set_exception(exc)
            return
        doc = json.loads(scored.body)
        group = doc["groups"][0]
        fingerprint = doc["recipe"]["fingerprint"]
        for pos, i in enumerate(live):
            waiter = batch.waiters[i]
            if waiter.done():
                continue
            waiter.set_result(
                SampleScore(
                    reward=group["rewards"][pos],
                    components={name: s[pos] for name, s in group["components"].items()},
                    errors=[e for e in group["errors"] if e["index"] == pos],
                    fingerprint=fingerprint,
                    group_size=len(live),
                )
            )
        await self.scorer.finish(scored)  # new scores to the cache, usage to the team
