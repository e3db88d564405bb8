"""The usage ledger: what each team used, per UTC day, in Redis.

One hash per team and day (``arb:usage:v1:<day>:<team>``) of counters, incremented with
one pipelined round trip after each scored request (never for an idempotent replay, which
was counted the first time):

- ``requests``, ``responses``, ``cache_hits``, ``cache_misses`` (component scores),
- ``judge_prompt_tokens``, ``judge_completion_tokens`` (as the judge reported them),
- ``component:<name>:responses`` and ``component:<name>:cache_hits``,
- ``errors:<kind>`` (null scores by kind), ``rate_limited`` (requests refused with 429),
  ``idempotent_replays`` (stored responses served again).

A set per day (``arb:usage:v1:<day>:teams``) names the teams that used it, for an admin's
read of every team. Entries expire after ``GATEWAY_USAGE_RETENTION_DAYS``. A Redis failure
loses that request's counts (``arbiter_gateway_redis_errors_total{op="usage"}``) and never
fails the request.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from datetime import UTC, date, datetime, timedelta

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from arbiter.errors import Unprocessable
from arbiter.proto.components import ScoreGroup
from arbiter.proto.usage import ComponentUsage, UsageDay, UsageReport
from arbiter.services.gateway.cache import REDIS_ERRORS
from arbiter.services.gateway.plan import ComponentScores

log = logging.getLogger("arbiter.gateway.usage")

TEAM_RESPONSES = Counter(
    "arbiter_gateway_team_responses_total", "Responses scored, by team.", ["team"]
)
TEAM_JUDGE_TOKENS = Counter(
    "arbiter_gateway_team_judge_tokens_total",
    "Judge tokens used, by team and kind (prompt, completion).",
    ["team", "kind"],
)

MAX_DAYS = 366
PREFIX = "arb:usage:v1"


def tally(
    comps: list[ComponentScores],
    groups: list[ScoreGroup],
    prompt_tokens: int,
    completion_tokens: int,
) -> Tally[str]:
    """One scored request's counters (the ledger's fields)."""
    n = sum(len(g.responses) for g in groups)
    out: Tally[str] = Tally(requests=1, responses=n)
    hits = 0
    for c in comps:
        out[f"component:{c.name}:responses"] += n
        if c.hits:
            out[f"component:{c.name}:cache_hits"] += c.hits
        hits += c.hits
        for errors in c.errors:
            for _, kind, _ in errors:
                out[f"errors:{kind}"] += 1
    out["cache_hits"] = hits
    out["cache_misses"] = n * len(comps) - hits
    out["judge_prompt_tokens"] = prompt_tokens
    out["judge_completion_tokens"] = completion_tokens
    return out


def today() -> date:
    return datetime.now(UTC).date()


def _key(day: date, team: str) -> str:
    return f"{PREFIX}:{day.isoformat()}:{team}"


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
        day = today()
        key = _key(day, team)
        teams = f"{PREFIX}:{day.isoformat()}:teams"
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
            log.warning("usage of team %s not recorded (%s)", team, type(exc).__name__)

    async def report(self, start: date, end: date, teams: list[str] | None) -> UsageReport:
        """Every (day, team) entry in [start, end]; ``teams=None``: every team that used it."""
        if end < start:
            raise Unprocessable("to: is before from", param="to", code="invalid_range")
        if (end - start).days >= MAX_DAYS:
            raise Unprocessable(
                f"to: at most {MAX_DAYS} days from `from`", param="to", code="invalid_range"
            )
        days = [start + timedelta(days=i) for i in range((end - start).days + 1)]
        if teams is None:
            pipe = self.redis.pipeline(transaction=False)
            for day in days:
                pipe.smembers(f"{PREFIX}:{day.isoformat()}:teams")
            found = await pipe.execute()
            per_day = [sorted(t.decode() for t in members) for members in found]
        else:
            per_day = [sorted(teams) for _ in days]
        pairs = [(day, team) for day, names in zip(days, per_day, strict=True) for team in names]
        pipe = self.redis.pipeline(transaction=False)
        for day, team in pairs:
            pipe.hgetall(_key(day, team))
        rows = await pipe.execute()
        out = [
            _usage_day(day, team, row) for (day, team), row in zip(pairs, rows, strict=True) if row
        ]
        return UsageReport(start=start, end=end, days=out)


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
