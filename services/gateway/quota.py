"""Per-team quotas: token buckets in Redis, one atomic script call per request.

Two budgets per team, from the keys file (``arbiter.keys.Team``):

- ``responses_per_minute``: a bucket of that many responses, refilled continuously at
  ``rate/60`` per second. A request takes as many tokens as it has responses (cached ones
  too: the quota bounds what a team may send). Not enough tokens: 429 with
  ``Retry-After`` = the seconds until there are. A request larger than the whole bucket can
  never pass: 413 ``exceeds_quota`` (split it).
- ``judge_tokens_per_day``: a bucket of a day's judge tokens, refilled at ``limit/86400``
  per second. A request that uses a judge component passes while the bucket is above
  zero; what the judge reports it used (prompt + completion tokens) is charged after the
  request, so the bucket may go below zero and the next requests wait until it refills.

The script reads the clock with Redis ``TIME``, so every gateway replica shares one clock
and one bucket; the check and the take are one script run (atomic). If Redis fails, the
request is served unlimited (counted in ``arbiter_gateway_redis_errors_total{op="quota"}``):
an outage of the cache's Redis must not stop training.
"""

from __future__ import annotations

import logging
import math

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from arbiter.errors import PayloadTooLarge, RateLimited
from arbiter.keys import Principal
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.gateway.cache import REDIS_ERRORS

log = logging.getLogger("arbiter.gateway.quota")
WARNINGS = ThrottledLog(log)  # one line per 10 s during a Redis outage, with a count

QUOTA_REJECTIONS = Counter(
    "arbiter_gateway_quota_rejections_total",
    "Requests refused with 429 by a team's quota.",
    ["team", "quota"],
)

MINUTE_MS = 60_000
DAY_MS = 86_400_000

_LEVEL = """
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local function level(key, cap, period)
  local v = redis.call('HMGET', key, 't', 'ts')
  local t, ts = tonumber(v[1]), tonumber(v[2])
  if t == nil or ts == nil then return cap end
  return math.min(cap, t + math.max(0, now - ts) * cap / period)
end
"""

# KEYS: the responses bucket, the judge bucket. ARGV: responses per minute (0 = no limit),
# the request's responses, judge tokens per day (0 = no limit), 1 if the request uses the
# judge. Returns {1, 0} (taken) or {0, ms to wait, which quota}.
TAKE_LUA = (
    _LEVEL
    + """
local rpm, cost = tonumber(ARGV[1]), tonumber(ARGV[2])
local jcap, judge = tonumber(ARGV[3]), tonumber(ARGV[4])
local r = 0
if rpm > 0 then
  r = level(KEYS[1], rpm, 60000)
  if r < cost then return {0, math.ceil((cost - r) * 60000 / rpm), 'responses_per_minute'} end
end
if jcap > 0 and judge == 1 then
  local j = level(KEYS[2], jcap, 86400000)
  if j <= 0 then return {0, math.ceil((1 - j) * 86400000 / jcap), 'judge_tokens_per_day'} end
end
if rpm > 0 then
  redis.call('HSET', KEYS[1], 't', tostring(r - cost), 'ts', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
return {1, 0}
"""
)

# KEYS: a bucket. ARGV: its capacity, tokens to take (negative: to give back), its refill
# period in ms. The level may go below zero (judge tokens are charged after the fact).
CHARGE_LUA = (
    _LEVEL
    + """
local cap, period = tonumber(ARGV[1]), tonumber(ARGV[3])
local j = math.min(cap, level(KEYS[1], cap, period) - tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 't', tostring(j), 'ts', now)
redis.call('PEXPIRE', KEYS[1], 2 * period)
return 1
"""
)


def bucket_keys(team: str) -> list[str]:
    return [f"arb:quota:v1:{team}:responses", f"arb:quota:v1:{team}:judge"]


class Quota:
    """Built once per app on the gateway's Redis; ``take`` before work, ``charge`` after."""

    def __init__(self, redis: Redis):
        self._take = redis.register_script(TAKE_LUA)
        self._charge = redis.register_script(CHARGE_LUA)

    async def take(
        self, who: Principal, responses: int, uses_judge: bool, param: str = "groups"
    ) -> int:
        """Take ``responses`` tokens and return how many were taken (0: no such quota, or
        Redis failed), or raise 429 (``Retry-After``) / 413 naming ``param`` (the
        request's field that holds the responses)."""
        rpm = who.limits.responses_per_minute or 0
        jcap = who.limits.judge_tokens_per_day or 0
        if not rpm and not (jcap and uses_judge):
            return 0
        if rpm and responses > rpm:
            raise PayloadTooLarge(
                f"{param}: {responses} responses in one request, more than team {who.team}'s "
                f"whole quota of {rpm} responses per minute; split the request",
                param=param,
                code="exceeds_quota",
            )
        try:
            answer = await self._take(
                keys=bucket_keys(who.team), args=[rpm, responses, jcap, int(uses_judge)]
            )
        except (RedisError, OSError, TimeoutError) as exc:
            REDIS_ERRORS.labels("quota").inc()
            WARNINGS.warning("take", "quota not checked (%s): unlimited", type(exc).__name__)
            return 0
        if int(answer[0]) == 1:
            return responses if rpm else 0
        wait_s = int(answer[1]) / 1000
        quota = answer[2].decode() if isinstance(answer[2], bytes) else str(answer[2])
        QUOTA_REJECTIONS.labels(who.team, quota).inc()
        err = RateLimited(
            f"team {who.team} is over its {quota} quota; retry after {math.ceil(wait_s)} s",
            code="quota_exceeded",
        )
        err.retry_after = wait_s
        raise err

    async def charge(self, who: Principal, judge_tokens: int) -> None:
        """Charge the judge tokens a request used (after it was scored)."""
        jcap = who.limits.judge_tokens_per_day
        if not jcap or judge_tokens <= 0:
            return
        await self._run_charge(bucket_keys(who.team)[1], jcap, judge_tokens, DAY_MS)

    async def refund(self, who: Principal, responses: int) -> None:
        """Give back what ``take`` took for a request that failed or was cancelled."""
        rpm = who.limits.responses_per_minute
        if rpm and responses > 0:
            await self._run_charge(bucket_keys(who.team)[0], rpm, -responses, MINUTE_MS)

    async def _run_charge(self, key: str, cap: int, amount: int, period_ms: int) -> None:
        try:
            await self._charge(keys=[key], args=[cap, amount, period_ms])
        except (RedisError, OSError, TimeoutError) as exc:
            REDIS_ERRORS.labels("quota").inc()
            WARNINGS.warning("charge", "quota not charged (%s)", type(exc).__name__)
