"""The usage ledger: what each team used, per UTC day, in Redis.

One hash per team and day (``arb:usage:v2:team:<day>:<team>``) of counters, incremented
with one pipelined round trip when a scoring call is settled (``lifecycle.py``; never for
an idempotent replay, which was counted the first time):

- ``requests``, ``responses``, ``cache_hits``, ``cache_misses`` (component scores),
- ``judge_prompt_tokens``, ``judge_completion_tokens`` (as the judge reported them),
- ``sandbox_cpu_ms`` (CPU time of the team's programs in the sandbox),
- ``component:<name>:responses`` and ``component:<name>:cache_hits``,
- ``errors:<kind>`` (null scores by kind), ``rate_limited`` (requests refused with 429),
  ``idempotent_replays`` (stored responses served again).

A set per day (``arb:usage:v2:teams:<day>``) names the teams that used it, for an admin's
read of every team. Each kind of key has its own namespace, so no team name (a team may
be called ``teams``) can reach another kind's key. Entries expire after
``GATEWAY_USAGE_RETENTION_DAYS``.

**No answered request is lost to Redis.** ``add`` never waits for Redis: it adds the
counts to a buffer in memory (one tally per team and day, so its size is bounded by the
teams, not the requests), and one writer task per process writes the buffer as a batch in
one script run. A batch that fails (Redis down, stalled, its pool exhausted) is kept and
written again, whole, when Redis answers; meanwhile new counts gather in the buffer. Each
batch carries an id that the script records (``arb:usage:v2:batch:<id>``, kept an hour)
before it adds anything, so a batch whose first try timed out after Redis had applied it
is not counted twice. The buffer holds at most ``MAX_PENDING`` (team, day) entries: past
that a request's counts are dropped and counted (``arbiter_gateway_usage_dropped_total``);
``arbiter_gateway_usage_pending`` is the requests waiting to be written. A read
(``/v1/usage``) writes this process's buffer first; a Redis failure while reading is a
503 that names no Redis command or key. What is still buffered when the process stops is
written if Redis answers within ``CLOSE_WAIT_S``, else lost (logged with its count).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter as Tally
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from prometheus_client import Counter, Gauge
from redis.asyncio import Redis
from redis.exceptions import RedisError

from arbiter.errors import Unavailable, Unprocessable
from arbiter.proto.usage import ComponentUsage, UsageDay, UsageReport
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.scoring.cache import REDIS_ERRORS
from arbiter.services.scoring.scoring import Scored

log = logging.getLogger("arbiter.gateway.usage")
WARNINGS = ThrottledLog(log)  # one line per 10 s during a Redis outage, with a count

TEAM_RESPONSES = Counter(
    "arbiter_gateway_team_responses_total", "Responses scored, by team.", ["team"]
)
TEAM_JUDGE_TOKENS = Counter(
    "arbiter_gateway_team_judge_tokens_total",
    "Judge tokens used, by team and kind (prompt, completion).",
    ["team", "kind"],
)
TEAM_SANDBOX_CPU = Counter(
    "arbiter_gateway_team_sandbox_cpu_seconds_total",
    "CPU time the sandbox's programs used (code_tests, python_grader), by team.",
    ["team"],
)
TEAM_NULLS = Counter(
    "arbiter_gateway_team_nulls_total",
    "Null scores (a component could not score a response), by team and error kind.",
    ["team", "kind"],
)

USAGE_PENDING = Gauge(
    "arbiter_gateway_usage_pending",
    "Answered requests whose usage is held in memory, not yet written to Redis.",
)
USAGE_DROPPED = Counter(
    "arbiter_gateway_usage_dropped_total",
    "Answered requests whose usage was dropped: the in-memory buffer was full.",
)

MAX_DAYS = 366
PREFIX = "arb:usage:v2"
MAX_PENDING = 10_000  # (team, day) entries held in memory while Redis cannot be written
BATCH_TTL_S = 3600  # how long a written batch's id is kept (a late retry of it is a no-op)
CLOSE_WAIT_S = 5.0  # at shutdown, how long the last write may take

# KEYS: the batch's id key, then per entry its hash and its day's index of teams.
# ARGV: the id's TTL, the entries' TTL, then per entry: the team, n, and n field/value pairs.
# Returns 1 (added) or 0 (this batch was added before: nothing done).
ADD_LUA = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local a = 3
for i = 2, #KEYS, 2 do
  local team, n = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  for _ = 1, n do
    redis.call('HINCRBY', KEYS[i], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  redis.call('EXPIRE', KEYS[i], ARGV[2])
  redis.call('SADD', KEYS[i + 1], team)
  redis.call('EXPIRE', KEYS[i + 1], ARGV[2])
end
return 1
"""


def tally(scored: Scored, only: list[tuple[int, int]] | None = None) -> Tally[str]:
    """The ledger's counters of a scored request (its ``Scored.totals``, per component and
    per error kind), or of its responses ``only`` (one compat sample of a group scored
    together); the judge's tokens go with the whole request."""
    out: Tally[str] = Tally(requests=1)
    out.update(scored.totals())
    picked = None if only is None else set(only)
    n = out["responses"] if picked is None else len(picked)
    if picked is not None:
        hits = sum(len(c.hit_at & picked) for c in scored.comps)
        out["responses"] = n
        out["cache_hits"] = hits
        out["cache_misses"] = n * len(scored.comps) - hits
    for c in scored.comps:
        out[f"component:{c.name}:responses"] += n
        comp_hits = c.hits if picked is None else len(c.hit_at & picked)
        if comp_hits:
            out[f"component:{c.name}:cache_hits"] += comp_hits
        for g, errors in enumerate(c.errors):
            for j, kind, _ in errors:
                if picked is None or (g, j) in picked:
                    out[f"errors:{kind}"] += 1
    return +out  # zero counts dropped


def today() -> date:
    return datetime.now(UTC).date()


def team_key(day: date, team: str) -> str:
    return f"{PREFIX}:team:{day.isoformat()}:{team}"


def index_key(day: date) -> str:
    return f"{PREFIX}:teams:{day.isoformat()}"


def batch_key(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}"


@dataclass
class Batch:
    """Counts on their way to Redis: written whole, under one id, however many tries."""

    id: str
    entries: dict[tuple[date, str], Tally[str]]
    requests: int


class Ledger:
    def __init__(self, redis: Redis, retention_days: int, retry_s: float = 1.0):
        self.redis = redis
        self.ttl_s = retention_days * 86400
        self.retry_s = max(retry_s, 0.1)  # after a failed write, wait this long
        self._add = redis.register_script(ADD_LUA)
        self._pending: dict[tuple[date, str], Tally[str]] = {}
        self._pending_requests = 0
        self._batch: Batch | None = None  # failed at least once: retried as it is
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False

    async def add(self, team: str, counts: Tally[str]) -> None:
        """Add one request's counters to today's entry of ``team`` (in memory; the writer
        task takes them to Redis)."""
        TEAM_RESPONSES.labels(team).inc(counts.get("responses", 0))
        for kind in ("prompt", "completion"):
            if tokens := counts.get(f"judge_{kind}_tokens", 0):
                TEAM_JUDGE_TOKENS.labels(team, kind).inc(tokens)
        if cpu_ms := counts.get("sandbox_cpu_ms", 0):
            TEAM_SANDBOX_CPU.labels(team).inc(cpu_ms / 1000)
        for field, value in counts.items():
            if field.startswith("errors:") and value:
                TEAM_NULLS.labels(team, field.removeprefix("errors:")).inc(value)
        entry = (today(), team)
        tally_ = self._pending.get(entry)
        if tally_ is None:
            if len(self._pending) >= MAX_PENDING:
                USAGE_DROPPED.inc()
                WARNINGS.warning("dropped", "usage dropped: %d entries wait for Redis", MAX_PENDING)
                return
            tally_ = self._pending[entry] = Tally()
        tally_.update(counts)
        self._pending_requests += 1
        USAGE_PENDING.inc()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_forever())
        self._wake.set()

    async def _write_forever(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            if not await self.flush():
                await asyncio.sleep(self.retry_s)
                self._wake.set()

    async def flush(self) -> bool:
        """Write the batch that failed before, then what was added until now; False if Redis
        failed (the counts stay in memory for the next try)."""
        async with self._lock:
            for _ in range(2):  # the retried batch, then the buffer as it is now
                if self._batch is None:
                    if not self._pending:
                        break
                    entries, requests = self._pending, self._pending_requests
                    self._pending, self._pending_requests = {}, 0
                    self._batch = Batch(uuid.uuid4().hex, entries, requests)
                try:
                    await self._write(self._batch)
                except (RedisError, OSError, TimeoutError) as exc:
                    if (task := asyncio.current_task()) is not None and task.cancelling():
                        # a cancel the Redis client answered as a connection error or a
                        # timeout: still a cancel, or the writer would outlive close()
                        raise asyncio.CancelledError from exc
                    REDIS_ERRORS.labels("usage").inc()
                    waiting = self._batch.requests + self._pending_requests
                    WARNINGS.warning(
                        "add",
                        "usage not written yet (Redis: %s); %d requests' usage held in memory",
                        type(exc).__name__,
                        waiting,
                    )
                    return False
                USAGE_PENDING.dec(self._batch.requests)
                self._batch = None
        return True

    async def _write(self, batch: Batch) -> None:
        keys = [batch_key(batch.id)]
        args: list[str | int] = [BATCH_TTL_S, self.ttl_s]
        for (day, team), counts in batch.entries.items():
            fields = [(f, v) for f, v in counts.items() if v]
            keys += [team_key(day, team), index_key(day)]
            args += [team, len(fields)]
            for field, value in fields:
                args += [field, value]
        await self._add(keys=keys, args=args)

    async def close(self) -> None:
        """Stop the writer; write what is left if Redis answers within ``CLOSE_WAIT_S``."""
        self._closing = True
        if self._writer is not None:
            self._wake.set()
            self._writer.cancel()
            await asyncio.wait({self._writer}, timeout=CLOSE_WAIT_S)
        written = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                written = await self.flush()
        left = self._pending_requests + (self._batch.requests if self._batch else 0)
        if not written and left:
            log.warning("usage of %d answered requests not written: Redis unreachable", left)

    async def report(self, start: date, end: date, teams: list[str] | None) -> UsageReport:
        """Every (day, team) entry in [start, end]; ``teams=None``: every team that used it."""
        if end < start:
            raise Unprocessable("to: is before from", param="to", code="invalid_range")
        if (end - start).days >= MAX_DAYS:
            raise Unprocessable(
                f"to: at most {MAX_DAYS} days from `from`", param="to", code="invalid_range"
            )
        days = [start + timedelta(days=i) for i in range((end - start).days + 1)]
        await self.flush()  # this process's counts first (a failure: the read fails too)
        try:
            return UsageReport(start=start, end=end, days=await self._read(days, teams))
        except (RedisError, OSError, TimeoutError) as exc:
            REDIS_ERRORS.labels("usage").inc()
            WARNINGS.warning("report", "usage not readable (Redis: %s)", type(exc).__name__)
            raise Unavailable("the usage ledger cannot be read right now; retry shortly") from None

    async def _read(self, days: list[date], teams: list[str] | None) -> list[UsageDay]:
        if teams is None:
            pipe = self.redis.pipeline(transaction=False)
            for day in days:
                pipe.smembers(index_key(day))
            found = await pipe.execute()
            per_day = [sorted(t.decode() for t in members) for members in found]
        else:
            per_day = [sorted(teams) for _ in days]
        pairs = [(day, team) for day, names in zip(days, per_day, strict=True) for team in names]
        pipe = self.redis.pipeline(transaction=False)
        for day, team in pairs:
            pipe.hgetall(team_key(day, team))
        rows = await pipe.execute()
        return [
            _usage_day(day, team, row) for (day, team), row in zip(pairs, rows, strict=True) if row
        ]


def _usage_day(day: date, team: str, row: dict[bytes, bytes]) -> UsageDay:
    fields = {k.decode(): int(v) for k, v in row.items()}
    components: dict[str, ComponentUsage] = {}
    errors: dict[str, int] = {}
    plain: dict[str, int] = {}
    for name, value in fields.items():
        if name.startswith("component:"):
            _, comp, what = name.split(":", 2)
            entry = components.setdefault(comp, ComponentUsage())
            setattr(entry, what, value)
        elif name.startswith("errors:"):
            errors[name.removeprefix("errors:")] = value
        else:
            plain[name] = value
    known = {k: v for k, v in plain.items() if k in UsageDay.model_fields}
    return UsageDay(day=day, team=team, components=components, errors=errors, **known)
