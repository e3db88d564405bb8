"""The embedding batcher's queue: which queued texts go in the next batch.

A thin front-end on the one fair-share policy (``common.fairshare``): every text is an
item of its request (a ``Job``) in its team's line, and its cost is its tokens, counted
when the request arrives. So teams share the encoder by tokens embedded (times their
``EMBEDDING_TEAM_WEIGHTS``), then a team's requests by the same rule, and a team's history
neither helps nor hurts it once it has been idle.

A batch holds at most ``max_texts`` texts and ``max_tokens`` tokens (the token budget), so
a batch of long texts is a batch of few texts and its encode time is bounded. It is filled
in runs of at most an eighth of it (``RUNS``), each from the request the policy names
next, so several teams share one batch; the filling stops at the first text that does not
fit what is left of the budget (it leads the next batch), and a text longer than the whole
budget goes alone in a batch of its own. Hence another team's request waits for at most
the batch being encoded and the one already collected, each of bounded tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from arbiter.services.common.fairshare import FairShare, Grant
from arbiter.services.embedding.encoder import Encoded

RUNS = 8  # a batch is filled in runs of at most 1/RUNS of its texts and of its tokens


@dataclass(eq=False)  # a request key: hashed by identity
class Job:
    """One request's texts, queued until every one of them has its row."""

    texts: list[str]
    costs: np.ndarray  # (n,) tokens per text, counted when the request arrived
    future: asyncio.Future[Encoded]
    enqueued: float
    team: str = ""
    vectors: np.ndarray | None = None
    tokens: np.ndarray | None = None
    truncated: np.ndarray | None = None
    remaining: int = 0  # texts without their row yet


Text = tuple[Job, int]  # an item of the policy: (its request, its index there)


@dataclass
class Batch:
    texts: list[str] = field(default_factory=list)
    # (job, first row in job, first row in batch, count)
    parts: list[tuple[Job, int, int, int]] = field(default_factory=list)
    tokens: int = 0  # the texts' counted tokens
    grants: list[Grant[Text]] = field(default_factory=list)  # settled once encoded

    def add(self, job: Job, start: int, count: int) -> None:
        self.parts.append((job, start, len(self.texts), count))
        self.texts.extend(job.texts[start : start + count])
        self.tokens += int(job.costs[start : start + count].sum())


def _dead(item: Text) -> bool:
    return item[0].future.done()  # the caller went away (cancelled) or already failed


class TextQueue:
    """Queued texts by team and request; ``fill`` moves them into a batch (see the module
    docstring). ``max_tokens`` 0: no token budget."""

    def __init__(
        self, *, max_texts: int, max_tokens: int, weights: Mapping[str, int] | None = None
    ):
        self.max_texts = max_texts
        self.max_tokens = max_tokens or math.inf
        self._policy: FairShare[Text] = FairShare(weights, dead=_dead)
        self.since = 0.0  # when the queue last went from empty to not empty

    @property
    def queued(self) -> int:
        """Texts queued (a cancelled job's leave at once)."""
        return self._policy.queued

    def __bool__(self) -> bool:
        return self._policy.queued > 0

    def push(self, job: Job) -> None:
        if not self._policy.queued:
            self.since = job.enqueued
        costs = job.costs
        if not len(costs):
            return
        # one push per run of equal costs (long texts, all cut at the limit, are one run)
        edges = [0, *(np.flatnonzero(costs[1:] != costs[:-1]) + 1).tolist(), len(costs)]
        for a, b in itertools.pairwise(edges):
            self._policy.push_many(job.team, job, [(job, i) for i in range(a, b)], int(costs[a]))

    def cancel(self, job: Job) -> None:
        """Drop ``job``'s queued texts (its caller went away)."""
        self._policy.cancel(job.team, job)

    def drain(self) -> list[Job]:
        """Every job with texts queued, its texts removed (the service stops)."""
        return list({id(job): job for _, _, (job, _) in self._policy.clear()}.values())

    def full(self, batch: Batch) -> bool:
        return len(batch.texts) >= self.max_texts or batch.tokens >= self.max_tokens

    def fill(self, batch: Batch) -> None:
        """Move queued texts into ``batch`` until it is full, the queue is empty, or the
        next text in turn does not fit (see the module docstring)."""
        policy = self._policy
        run_texts = max(1, self.max_texts // RUNS)
        run_tokens = self.max_tokens / RUNS
        while policy.queued and not self.full(batch):
            texts_left = self.max_texts - len(batch.texts)
            tokens_left = self.max_tokens - batch.tokens
            limit = min(texts_left, run_texts)
            grant = policy.pop(limit, budget=min(tokens_left, run_tokens))
            if grant is None:  # its next text is more than a run: alone in this run
                grant = policy.pop(1, budget=tokens_left if batch.texts else math.inf)
            if grant is None:  # it does not fit what is left: it leads the next batch
                break
            batch.grants.append(grant)
            job, start = grant.items[0]
            batch.add(job, start, len(grant.items))  # a run: consecutive texts of one job

    def settle(self, batch: Batch) -> None:
        """The batch's texts are encoded (or failed): they leave the policy's flight."""
        for grant in batch.grants:
            self._policy.settle(grant)
        batch.grants.clear()
