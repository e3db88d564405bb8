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
and one bucket; the check and the take are one script run (atomic).

**Redis down is not "no limits".** Each process keeps its own share of every team's
buckets (``LocalBuckets``: the quota divided by ``GATEWAY_QUOTA_REPLICAS`` x
``GATEWAY_PROCESSES``), debited by every take, charge and refund this process makes, so it
holds about what this process has used of the shared bucket. When a quota call cannot reach
Redis (refused, stalled past ``GATEWAY_REDIS_TIMEOUT_S``, no pool connection in that time;
``arbiter_gateway_redis_errors_total{op="quota"}``), that call and every quota call of the
next ``GATEWAY_REDIS_RETRY_S`` are decided by the local buckets alone: same 429s, same
``Retry-After``. What was taken locally is owed to Redis and added to the shared buckets
by the team's next quota call that reaches it, so the outage is not served a second time
when Redis comes back. A team whose load spreads over the replicas is served at most its
quota during an outage; one whose load moved between replicas at the outage, at most one
replica's share more.

**A queue for Redis is not an outage.** A team's quota calls go to Redis at most
``max(1, GATEWAY_REDIS_MAX_CONNECTIONS // 4)`` at a time; the rest wait their turn, at most
``GATEWAY_QUOTA_WAIT_S``, then are refused with 429 ``quota_busy`` (``Retry-After: 1``). A
team that floods the gateway is refused; the pool stays open to the other teams. Most of a
flood never queues: each process also keeps whole buckets debited by what it took itself
and by the calls it has waiting (``mine``). The shared bucket, debited by every replica,
never holds more, so a request this process alone has no room for is refused with 429
``quota_exceeded`` at once, without Redis.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from arbiter.errors import PayloadTooLarge, RateLimited
from arbiter.keys import Principal
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.scoring.cache import REDIS_ERRORS

log = logging.getLogger("arbiter.gateway.quota")
WARNINGS = ThrottledLog(log)  # one line per 10 s during a Redis outage, with a count

QUOTA_REJECTIONS = Counter(
    "arbiter_gateway_quota_rejections_total",
    "Requests refused with 429 by a team's quota.",
    ["team", "quota"],
)

RESPONSES, JUDGE = "responses", "judge"
PERIOD_S = {RESPONSES: 60.0, JUDGE: 86_400.0}
BUSY_RETRY_S = 1.0

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
# judge, then the responses and judge tokens owed (taken while Redis was unreachable; they
# are taken first, whatever the answer). Returns {1, 0} (taken) or {0, ms to wait, which quota}.
TAKE_LUA = (
    _LEVEL
    + """
local rpm, cost = tonumber(ARGV[1]), tonumber(ARGV[2])
local jcap, judge = tonumber(ARGV[3]), tonumber(ARGV[4])
local owed_r, owed_j = tonumber(ARGV[5]), tonumber(ARGV[6])
local r = 0
if rpm > 0 then
  r = level(KEYS[1], rpm, 60000) - owed_r
  if owed_r ~= 0 then
    redis.call('HSET', KEYS[1], 't', tostring(r), 'ts', now)
    redis.call('PEXPIRE', KEYS[1], 120000)
  end
end
if jcap > 0 and owed_j ~= 0 then
  redis.call('HSET', KEYS[2], 't', tostring(level(KEYS[2], jcap, 86400000) - owed_j), 'ts', now)
  redis.call('PEXPIRE', KEYS[2], 172800000)
end
if rpm > 0 and r < cost then
  return {0, math.ceil((cost - r) * 60000 / rpm), 'responses_per_minute'}
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


class LocalBuckets:
    """This process's share of every team's buckets (the module docstring), on its own clock."""

    def __init__(self, share: float):
        self.share = share  # 1 / (replicas x processes)
        self._levels: dict[tuple[str, str], tuple[float, float]] = {}  # (level, monotonic ts)

    def level(self, key: tuple[str, str], cap: int, now: float) -> float:
        local_cap = cap * self.share
        found = self._levels.get(key)
        if found is None:
            return local_cap
        level, ts = found
        return min(local_cap, level + (now - ts) * local_cap / PERIOD_S[key[1]])

    def add(self, key: tuple[str, str], cap: int, amount: float, now: float | None = None) -> None:
        """Take ``amount`` (negative: give it back); the level stays above minus a bucket."""
        now = time.monotonic() if now is None else now
        level = self.level(key, cap, now) - amount
        self._levels[key] = (max(-cap * self.share, level), now)

    def wait_s(self, team: str, rpm: int, cost: int, jcap: int, judge: bool) -> tuple[float, str]:
        """(0, "") if there is enough for ``cost`` responses, else the seconds until there is
        and the quota short of it: ``TAKE_LUA``'s rule, in process. Takes nothing."""
        now = time.monotonic()
        if rpm:
            r = self.level((team, RESPONSES), rpm, now)
            need = min(cost, rpm * self.share)  # a request larger than the share: a full one
            if r < need:
                return (need - r) * PERIOD_S[RESPONSES] / (rpm * self.share), "responses_per_minute"
        if jcap and judge:
            j = self.level((team, JUDGE), jcap, now)
            if j <= 0:
                return (1 - j) * PERIOD_S[JUDGE] / (jcap * self.share), "judge_tokens_per_day"
        return 0.0, ""


class Quota:
    """Built once per app on the gateway's Redis; ``take`` before work, ``charge`` after."""

    def __init__(
        self,
        redis: Redis,
        *,
        share: float = 1.0,
        per_team: int = 16,
        wait_s: float = 2.0,
        retry_s: float = 1.0,
    ):
        self._take = redis.register_script(TAKE_LUA)
        self._charge = redis.register_script(CHARGE_LUA)
        self.local = LocalBuckets(share)  # decides while Redis cannot
        # What this process took, on whole buckets: the shared bucket, debited by every
        # replica, never holds more, so a request it is short for is refused without Redis.
        self.mine = LocalBuckets(1.0)
        self.per_team = per_team  # a team's quota calls at Redis at once
        self.wait_s = wait_s  # how long one waits for its turn
        self.retry_s = retry_s  # after a Redis failure, decide locally this long
        self._turns: dict[str, asyncio.Semaphore] = {}
        self._owed: dict[tuple[str, str], int] = {}  # taken locally, not yet in Redis
        self._local_until = 0.0

    async def take(
        self, who: Principal, responses: int, uses_judge: bool, param: str = "groups"
    ) -> int:
        """Take ``responses`` tokens and return how many were taken (0: no such quota), or
        raise 429 (``Retry-After``) / 413 naming ``param`` (the request's field that holds
        the responses)."""
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
        team = who.team
        taken = responses if rpm else 0
        if time.monotonic() < self._local_until:
            return self._take_locally(team, rpm, responses, jcap, uses_judge, taken)
        self._check_mine(team, rpm, responses, jcap, uses_judge)
        # Reserved in ``mine`` while it waits: a burst's requests past what this process
        # could ever be given are refused at once instead of queueing for Redis.
        self.mine.add((team, RESPONSES), rpm, taken)
        answer = None
        try:
            async with self._turn(team):
                if time.monotonic() < self._local_until:  # Redis failed while this one waited
                    raise _GoLocal
                owed = self._owed.pop((team, RESPONSES), 0), self._owed.pop((team, JUDGE), 0)
                try:
                    answer = await self._take(
                        keys=bucket_keys(team), args=[rpm, responses, jcap, int(uses_judge), *owed]
                    )
                except (RedisError, OSError, TimeoutError) as exc:
                    self._owe(team, RESPONSES, owed[0])
                    self._owe(team, JUDGE, owed[1])
                    self._failed("take", exc)
                    raise _GoLocal from None
        except _GoLocal:
            pass
        finally:
            if answer is None or int(answer[0]) != 1:
                self.mine.add((team, RESPONSES), rpm, -taken)  # the reservation goes back
        if answer is None:
            return self._take_locally(team, rpm, responses, jcap, uses_judge, taken)
        if int(answer[0]) == 1:
            self.local.add((team, RESPONSES), rpm, taken)  # ``mine`` has it already
            return taken
        quota = answer[2].decode() if isinstance(answer[2], bytes) else str(answer[2])
        raise _refusal(team, quota, int(answer[1]) / 1000)

    def _take_locally(
        self, team: str, rpm: int, responses: int, jcap: int, judge: bool, taken: int
    ) -> int:
        wait_s, quota = self.local.wait_s(team, rpm, responses, jcap, judge)
        if quota:
            raise _refusal(team, quota, wait_s)
        self._debit(team, RESPONSES, rpm, taken)
        self._owe(team, RESPONSES, taken)
        return taken

    def _check_mine(self, team: str, rpm: int, responses: int, jcap: int, judge: bool) -> None:
        """429 if this process alone has taken what the request needs (``self.mine``); not
        while it owes Redis (the call goes to Redis, which gets what is owed)."""
        if self._owed.get((team, RESPONSES)) or self._owed.get((team, JUDGE)):
            return
        wait_s, quota = self.mine.wait_s(team, rpm, responses, jcap, judge)
        if quota:
            raise _refusal(team, quota, wait_s)

    def _debit(self, team: str, kind: str, cap: int, amount: int) -> None:
        if cap and amount:
            self.local.add((team, kind), cap, amount)
            self.mine.add((team, kind), cap, amount)

    @asynccontextmanager
    async def _turn(self, team: str) -> AsyncIterator[None]:
        """One of the team's ``per_team`` places at Redis, waited for at most ``wait_s``."""
        turn = self._turns.get(team)
        if turn is None:
            turn = self._turns[team] = asyncio.Semaphore(self.per_team)
        try:
            async with asyncio.timeout(self.wait_s):
                await turn.acquire()
        except TimeoutError:
            QUOTA_REJECTIONS.labels(team, "busy").inc()
            err = RateLimited(
                f"team {team}'s quota checks waited {self.wait_s:g} s for Redis "
                f"({self.per_team} at a time; GATEWAY_QUOTA_WAIT_S): it sends faster than they "
                "are answered; retry shortly",
                code="quota_busy",
            )
            err.retry_after = BUSY_RETRY_S
            raise err from None
        try:
            yield
        finally:
            turn.release()

    def _owe(self, team: str, kind: str, amount: int) -> None:
        if amount:
            self._owed[(team, kind)] = self._owed.get((team, kind), 0) + amount

    def _failed(self, what: str, exc: BaseException) -> None:
        REDIS_ERRORS.labels("quota").inc()
        WARNINGS.warning(what, "quota decided in this process (Redis: %s)", type(exc).__name__)
        self._local_until = time.monotonic() + self.retry_s

    async def charge(self, who: Principal, judge_tokens: int) -> None:
        """Charge the judge tokens a request used (after it was scored)."""
        jcap = who.limits.judge_tokens_per_day
        if not jcap or judge_tokens <= 0:
            return
        await self._run_charge(who.team, JUDGE, jcap, judge_tokens)

    async def refund(self, who: Principal, responses: int) -> None:
        """Give back what ``take`` took for a request that failed or was cancelled."""
        rpm = who.limits.responses_per_minute
        if rpm and responses > 0:
            await self._run_charge(who.team, RESPONSES, rpm, -responses)

    async def _run_charge(self, team: str, kind: str, cap: int, amount: int) -> None:
        self._debit(team, kind, cap, amount)
        if time.monotonic() < self._local_until:
            self._owe(team, kind, amount)
            return
        key = bucket_keys(team)[0 if kind == RESPONSES else 1]
        try:
            await self._charge(keys=[key], args=[cap, amount, int(PERIOD_S[kind] * 1000)])
        except (RedisError, OSError, TimeoutError) as exc:
            self._owe(team, kind, amount)
            self._failed("charge", exc)


class _GoLocal(Exception):
    """Redis cannot answer this quota call: the process's own buckets decide."""


def _refusal(team: str, quota: str, wait_s: float) -> RateLimited:
    QUOTA_REJECTIONS.labels(team, quota).inc()
    err = RateLimited(
        f"team {team} is over its {quota} quota; retry after {math.ceil(wait_s)} s",
        code="quota_exceeded",
    )
    err.retry_after = wait_s
    return err
