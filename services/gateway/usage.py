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
``GATEWAY_USAGE_RETENTION_DAYS``. A Redis failure while recording loses that request's
counts (``arbiter_gateway_redis_errors_total{op="usage"}``, a throttled warning) and never
fails the request; while reading, it is a 503 that names no Redis command or key.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from datetime import UTC, date, datetime, timedelta

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from arbiter.errors import Unavailable, Unprocessable
from arbiter.proto.usage import ComponentUsage, UsageDay, UsageReport
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.gateway.cache import REDIS_ERRORS
from arbiter.services.gateway.scoring import Scored

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

MAX_DAYS = 366
PREFIX = "arb:usage:v2"


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


class Ledger:
    def __init__(self, redis: Redis, retention_days: int):
        self.redis = redis
        self.ttl_s = retention_days * 86400

    async def add(self, team: str, counts: Tally[str]) -> None:
        """Add one request's counters to today's entry of ``team``."""
        TEAM_RESPONSES.labels(team).inc(counts.get("responses", 0))
        for kind in ("prompt", "completion"):
            if tokens := counts.get(f"judge_{kind}_tokens", 0):
                TEAM_JUDGE_TOKENS.labels(team, kind).inc(tokens)
        if cpu_ms := counts.get("sandbox_cpu_ms", 0):
            TEAM_SANDBOX_CPU.labels(team).inc(cpu_ms / 1000)
        for field, value in counts.items():
            if field.startswith("errors:") and value:
                TEAM_NULLS.labels(team, field.removeprefix("errors:")).inc(value)
        day = today()
        key = team_key(day, team)
        teams = index_key(day)
        try:
            pipe = self.redis.pipeline(transaction=False)
            for field, value in counts.items():
                if value:
                    pipe.hincrby(key, field, value)
            pipe.expire(key, self.ttl_s)
            pipe.sadd(teams, team)
            pipe.expire(teams, self.ttl_s)
            await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            REDIS_ERRORS.labels("usage").inc()
            WARNINGS.warning("add", "usage not recorded (Redis: %s)", type(exc).__name__)

    async def report(self, start: date, end: date, teams: list[str] | None) -> UsageReport:
        """Every (day, team) entry in [start, end]; ``teams=None``: every team that used it."""
        if end < start:
            raise Unprocessable("to: is before from", param="to", code="invalid_range")
        if (end - start).days >= MAX_DAYS:
            raise Unprocessable(
                f"to: at most {MAX_DAYS} days from `from`", param="to", code="invalid_range"
            )
        days = [start + timedelta(days=i) for i in range((end - start).days + 1)]
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
