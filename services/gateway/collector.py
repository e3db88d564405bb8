"""Group-aware batching for the sample-level routes (OpenRLHF, slime, NeMo Gym).

Those frameworks post one sample per request, but GRPO's group components (``diversity``)
need the whole group. Samples are collected per key (recipe, prompt, reference, team):
the first sample of a key opens a batch and a window; the batch is scored as one group
when the window closes or when it holds ``group_size`` samples (the caller's, else
``GATEWAY_COMPAT_MAX_GROUP``), whichever comes first. Every waiter then gets its own
index of that group, read from the typed ``Scored`` (never from rendered bytes). A full
batch closes at once and the next sample opens a new one, so a batch never exceeds its
size, and the window bounds the latency the collection adds.

Every waiter is answered: whatever the scoring raises reaches each waiter as its error.
A waiter whose client went away leaves its batch: before the batch is sent its sample is
dropped, and a batch whose every waiter left is not scored (or its scoring is cancelled).
Each sample marks its own request's ``Progress`` once its work reached a component (a
sample whose client left while its group was being scored counts as started), so the
request's settlement charges exactly that.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client import Histogram

from arbiter.keys import ANONYMOUS
from arbiter.proto.components import ScoreGroup
from arbiter.services.gateway.render import group_errors
from arbiter.services.gateway.usage import tally
from arbiter.services.scoring.recipes import ResolvedRecipe
from arbiter.services.scoring.scoring import Progress, Scope, Scored, Scorer

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
    team: str = ANONYMOUS  # two teams' samples never land in one group (auth, usage, cache)
    cache: str | None = None  # the cache space (the team's, or None: shared)
    weight: int = 1  # the team's share of the component slots (GATEWAY_TEAM_WEIGHTS)


class SampleScore(NamedTuple):
    """One sample's share of its group's score, and of what settles."""

    reward: float | None
    components: dict[str, float | None]
    errors: list[dict[str, Any]]  # {"component", "index", "kind", "message"} of this sample
    fingerprint: str
    group_size: int
    counts: Tally[str]  # the ledger's counters of this sample
    judge_tokens: int  # the group's, on its first sample still waiting (else 0)
    writes: list[tuple[str, str]]  # the group's new scores, likewise


@dataclass
class _Sample:
    response: str
    future: asyncio.Future[SampleScore]
    progress: Progress  # its request's
    at: tuple[int, int]  # its place in that progress


@dataclass
class _Batch:
    key: GroupKey
    recipe: ResolvedRecipe
    size: int
    samples: list[_Sample] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None
    sent: bool = False


class GroupCollector:
    """Built once per app; ``submit`` is called once per sample of a compat request."""

    def __init__(self, scorer: Scorer, window_s: float, max_group: int):
        self.scorer = scorer
        self.window_s = window_s
        self.max_group = max_group
        self._open: dict[GroupKey, _Batch] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def submit(
        self,
        key: GroupKey,
        recipe: ResolvedRecipe,
        response: str,
        progress: Progress,
        at: tuple[int, int],
        *,
        window_s: float | None = None,
        group_size: int | None = None,
    ) -> SampleScore:
        batch = self._open.get(key)
        if batch is None:
            batch = _Batch(key, recipe, min(group_size or self.max_group, self.max_group))
            self._open[key] = batch
            wait = self.window_s if window_s is None else window_s
            batch.timer = asyncio.get_running_loop().call_later(wait, self._send, batch)
        sample = _Sample(response, asyncio.get_running_loop().create_future(), progress, at)
        batch.samples.append(sample)
        if len(batch.samples) >= batch.size:
            self._send(batch)
        try:
            return await sample.future
        except asyncio.CancelledError:
            if batch.sent:  # its group is being scored: its work counts as started
                progress.start([at])
            self._leave(batch)
            raise

    def _leave(self, batch: _Batch) -> None:
        """A waiter was cancelled (client gone): stop work nobody waits for."""
        if batch.sent and batch.task is not None and all(s.future.done() for s in batch.samples):
            batch.task.cancel()

    def _send(self, batch: _Batch) -> None:
        if batch.sent:
            return
        batch.sent = True
        if batch.timer is not None:
            batch.timer.cancel()
        if self._open.get(batch.key) is batch:
            del self._open[batch.key]
        live = [s for s in batch.samples if not s.future.done()]
        if not live:
            return
        batch.task = asyncio.get_running_loop().create_task(self._score(batch, live))
        self._tasks.add(batch.task)
        batch.task.add_done_callback(self._tasks.discard)

    async def _score(self, batch: _Batch, live: list[_Sample]) -> None:
        key = batch.key
        scope = Scope(team=key.team, cache=key.cache, weight=key.weight)
        try:
            GROUP_SIZE.observe(len(live))
            group = ScoreGroup.model_construct(
                id="",
                prompt=key.prompt,
                reference=key.reference,
                responses=[s.response for s in live],
            )  # fmt: skip  (each text was checked by its route)
            scored = await self.scorer.score(batch.recipe, [group], scope)
            first = next((p for p, s in enumerate(live) if not s.future.done()), 0)
            answers = _answers(scored, len(live), first)
        except asyncio.CancelledError:
            raise  # every waiter left (each counted its own sample)
        except BaseException as exc:  # every waiter answers with the same envelope
            self._started(live, scope.progress)
            for s in live:
                if not s.future.done():
                    s.future.set_exception(exc)
            return
        self._started(live, scope.progress)
        for s, answer in zip(live, answers, strict=True):
            if not s.future.done():
                s.future.set_result(answer)

    @staticmethod
    def _started(live: list[_Sample], progress: Progress) -> None:
        for pos, s in enumerate(live):
            if progress.started((0, pos)) and not s.future.done():
                s.progress.start([s.at])


def _answers(scored: Scored, n: int, first: int) -> list[SampleScore]:
    """Each sample's share of a one-group ``Scored``; the ``first`` still waiting carries
    the group's judge tokens and new cache entries (they settle once)."""
    errors = group_errors(scored, 0)
    fingerprint = scored.recipe.ref.fingerprint
    tokens = scored.merged.prompt_tokens + scored.merged.completion_tokens
    out = []
    for pos in range(n):
        counts = tally(scored, [(0, pos)])
        if pos != first:
            counts["judge_prompt_tokens"] = counts["judge_completion_tokens"] = 0
            counts["sandbox_cpu_ms"] = 0
        out.append(
            SampleScore(
                reward=scored.rewards[0][pos],
                components={c.name: c.scores[0][pos] for c in scored.comps},
                errors=[e for e in errors if e["index"] == pos],
                fingerprint=fingerprint,
                group_size=n,
                counts=counts,
                judge_tokens=tokens if pos == first else 0,
                writes=scored.writes if pos == first else [],
            )
        )
    return out
