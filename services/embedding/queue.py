"""The embedding batcher's queue: which queued texts go in the next batch.

Every request is a ``Job`` (its texts, each with its token count) in its team's line. A
batch holds at most ``max_texts`` texts and ``max_tokens`` tokens (the token budget; a text
longer than the budget goes alone, in a batch of its own). It is filled round-robin
across teams first, an equal share of the texts and of the tokens left (times the team's
weight) from every team with texts queued, then across the team's requests the same way;
a team, and a request, with texts left goes to the back of its line. So another team's
request is in the next batch whatever one team queued, and a batch of long texts is a
batch of few texts: a request waits behind at most about one batch's tokens.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from arbiter.services.embedding.encoder import Encoded

NO_BUDGET = 1 << 40  # tokens: "no token budget", far inside int64 when sums are added


@dataclass
class Job:
    """One request's texts, queued until every one of them has its row."""

    texts: list[str]
    costs: np.ndarray  # (n,) tokens per text, counted when the request arrived
    future: asyncio.Future[Encoded]
    enqueued: float
    vectors: np.ndarray | None = None
    tokens: np.ndarray | None = None
    truncated: np.ndarray | None = None
    remaining: int = 0  # texts without their row yet
    next_index: int = 0  # first text not yet taken into a batch
    cum: np.ndarray = field(init=False)  # (n + 1,) running token total, cum[0] = 0

    def __post_init__(self) -> None:
        self.cum = np.concatenate(([0], np.cumsum(self.costs, dtype=np.int64)))

    @property
    def left(self) -> int:
        return len(self.texts) - self.next_index

    def fitting(self, tokens: int) -> int:
        """How many of the texts not yet taken, in order, fit in ``tokens``."""
        limit = self.cum[self.next_index] + tokens
        return int(np.searchsorted(self.cum, limit, side="right")) - 1 - self.next_index


@dataclass
class Batch:
    texts: list[str] = field(default_factory=list)
    # (job, first row in job, first row in batch, count)
    parts: list[tuple[Job, int, int, int]] = field(default_factory=list)
    tokens: int = 0  # the texts' counted tokens

    def add(self, job: Job, count: int) -> None:
        start = job.next_index
        self.parts.append((job, start, len(self.texts), count))
        self.texts.extend(job.texts[start : start + count])
        self.tokens += int(job.cum[start + count] - job.cum[start])
        job.next_index += count


class TextQueue:
    """Queued jobs by team; ``fill`` moves texts into a batch (see the module docstring)."""

    def __init__(
        self, *, max_texts: int, max_tokens: int, weights: Mapping[str, int] | None = None
    ):
        self.max_texts = max_texts
        self.max_tokens = max_tokens or NO_BUDGET
        self._weights = dict(weights or {})
        # team -> its queued jobs; the dict's order is the turn order across teams
        self._teams: dict[str, deque[Job]] = {}
        self.queued = 0  # texts

    def __bool__(self) -> bool:
        return bool(self._teams)

    def push(self, job: Job, team: str) -> None:
        line = self._teams.get(team)
        if line is None:
            line = self._teams[team] = deque()
        line.append(job)
        self.queued += job.left

    def oldest(self) -> float:
        """When the longest-waiting queued job arrived."""
        return min(line[0].enqueued for line in self._teams.values())

    def drain(self) -> list[Job]:
        """Every queued job, removed (the service stops)."""
        jobs = [job for line in self._teams.values() for job in line]
        self._teams.clear()
        self.queued = 0
        return jobs

    def full(self, batch: Batch) -> bool:
        return len(batch.texts) >= self.max_texts or batch.tokens >= self.max_tokens

    def fill(self, batch: Batch) -> None:
        """Move queued texts into ``batch`` until it is full or nothing more fits: a share
        (by weight) from each team in turn; a team with texts left goes to the back."""
        teams, weights = self._teams, self._weights
        while teams and not self.full(batch):
            names = list(teams)
            weight_left = sum(weights.get(n, 1) for n in names)
            before = self.queued
            for name in names:
                if self.full(batch):
                    break
                weight = weights.get(name, 1)
                texts = max(1, (self.max_texts - len(batch.texts)) * weight // weight_left)
                tokens = max(1, (self.max_tokens - batch.tokens) * weight // weight_left)
                weight_left -= weight
                line = teams.pop(name)
                self._take_jobs(line, len(batch.texts) + texts, batch.tokens + tokens, batch)
                if line:
                    teams[name] = line  # back of the line: the other teams go first
            if self.queued == before:  # nothing more fits this batch
                break

    def _take_jobs(self, line: deque[Job], max_texts: int, max_tokens: int, batch: Batch) -> None:
        """Texts of one team's jobs into ``batch`` until it holds ``max_texts`` texts and
        ``max_tokens`` tokens or the team has none left: an equal share from each job in
        turn; a job with texts left goes to the back of the team's line. The team's first
        text may use the batch's whole room (a long text in a share too small for it), and
        goes alone into an empty batch whatever its length."""
        first = True
        while line and len(batch.texts) < max_texts and batch.tokens < max_tokens:
            in_line = len(line)
            for k in range(in_line):
                job = line.popleft()
                if job.future.done():  # the caller went away (cancelled): skip its texts
                    self.queued -= job.left
                    continue
                share = max(1, (max_texts - len(batch.texts)) // (in_line - k))
                share_tokens = (max_tokens - batch.tokens) // (in_line - k)
                count = min(share, job.left, job.fitting(share_tokens))
                if count == 0:  # its next text alone is more than its share of tokens
                    room = (self.max_tokens if first else max_tokens) - batch.tokens
                    count = 1 if job.fitting(room) or not batch.texts else 0
                if count == 0:  # the team's tokens are spent: stop at this job
                    line.appendleft(job)
                    return
                batch.add(job, count)
                first = False
                self.queued -= count
                if job.left:
                    line.append(job)
                if len(batch.texts) >= max_texts or batch.tokens >= max_tokens:
                    return
