"""Per-team quotas of the environments (``/ors``, ``/nemo-gym/envs``): tool calls and the
sandbox CPU those calls used, each a token bucket per minute in the state Redis.

- ``GATEWAY_ENVS_TOOL_CALLS_PER_MINUTE``: a bucket of that many tool calls, refilled
  continuously. A tool call takes one before it is forwarded; empty: 429 with
  ``Retry-After`` = the seconds until there is one.
- ``GATEWAY_ENVS_SANDBOX_CPU_S_PER_MINUTE``: a bucket of sandbox CPU milliseconds. How
  much a call uses is known only after it ran (the envs service reports it in
  ``X-Arbiter-Usage``), so it is charged then and the bucket may go below zero; a tool call
  passes while the bucket is above zero, so a team that used more waits until it refills.

One script run checks and takes (atomic; the clock is Redis ``TIME``, shared by every
replica), as ``quota.py`` does for the scoring quotas. While Redis cannot be reached, each
process decides with its own share of the buckets (1 / (``GATEWAY_QUOTA_REPLICAS`` x
``GATEWAY_PROCESSES``)): the same 429s, never "no limits".
"""

from __future__ import annotations

import math
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError

from arbiter.errors import RateLimited, Unprocessable
from arbiter.services.gateway.quota import _LEVEL, CHARGE_LUA, QUOTA_REJECTIONS, WARNINGS
from arbiter.services.scoring.cache import REDIS_ERRORS

PERIOD_MS = 60_000
CALLS, CPU = "tool_calls_per_minute", "sandbox_cpu_s_per_minute"

# KEYS: the calls bucket, the CPU bucket. ARGV: calls per minute (0 = no limit), CPU ms per
# minute (0 = no limit), the calls to take. Returns {1, 0} (taken) or {0, ms to wait, which
# quota}.
TAKE_LUA = (
    _LEVEL
    + """
local calls, cpu, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local c = 0
if calls > 0 then
  c = level(KEYS[1], calls, 60000)
  if c < n then return {0, math.ceil((n - c) * 60000 / calls), 'tool_calls_per_minute'} end
end
if cpu > 0 then
  local u = level(KEYS[2], cpu, 60000)
  if u <= 0 then return {0, math.ceil((1 - u) * 60000 / cpu), 'sandbox_cpu_s_per_minute'} end
end
if calls > 0 then
  redis.call('HSET', KEYS[1], 't', tostring(c - n), 'ts', now)
  redis.call('PEXPIRE', KEYS[1], 120000)
end
return {1, 0}
"""
)


def bucket_keys(team: str) -> list[str]:
    return [f"arb:envs-quota:v1:{team}:calls", f"arb:envs-quota:v1:{team}:cpu"]


class _Local:
    """This process's share of every team's two buckets, on its own clock."""

    def __init__(self, share: float):
        self.share = share
        self._levels: dict[tuple[str, str], tuple[float, float]] = {}

    def level(self, key: tuple[str, str], cap: int) -> float:
        local_cap = cap * self.share
        found = self._levels.get(key)
        if found is None:
            return local_cap
        level, ts = found
        return min(local_cap, level + (time.monotonic() - ts) * local_cap * 1000 / PERIOD_MS)

    def add(self, key: tuple[str, str], cap: int, amount: float) -> None:
        level = self.level(key, cap) - amount
        self._levels[key] = (max(-cap * self.share, level), time.monotonic())


class EnvsQuota:
    """Built once per app on the state Redis; ``take`` before a tool call, ``charge`` after."""

    def __init__(
        self, redis: Redis, calls_per_minute: int, cpu_s_per_minute: float, *, share: float = 1.0
    ):
        self.calls = calls_per_minute  # 0: no limit
        self.cpu_ms = int(cpu_s_per_minute * 1000)  # 0: no limit
        self._take = redis.register_script(TAKE_LUA)
        self._charge = redis.register_script(CHARGE_LUA)
        self.local = _Local(share)  # decides while Redis cannot
        self.retry_s = 1.0
        self._local_until = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.calls or self.cpu_ms)

    async def take(self, team: str, n: int = 1) -> None:
        """Take ``n`` tool calls (a batch's at once), or raise 429 (``Retry-After``); more
        than a minute's calls at once is 422 (split the batch)."""
        if not self.enabled:
            return
        if self.calls and n > self.calls:
            raise Unprocessable(
                f"{n} tool calls at once are more than the team's {self.calls} per minute "
                "(GATEWAY_ENVS_TOOL_CALLS_PER_MINUTE); send them in smaller batches",
                code="batch_over_quota",
            )
        if time.monotonic() >= self._local_until:
            try:
                args = [self.calls, self.cpu_ms, n]
                answer = await self._take(keys=bucket_keys(team), args=args)
            except (RedisError, OSError, TimeoutError) as exc:
                self._failed(exc)
            else:
                if int(answer[0]) != 1:
                    quota = answer[2].decode() if isinstance(answer[2], bytes) else str(answer[2])
                    raise _refusal(team, quota, int(answer[1]) / 1000)
                self._debit(team, n, 0)
                return
        self._take_locally(team, n)

    def _take_locally(self, team: str, n: int) -> None:
        share = self.local.share
        if self.calls:
            c = self.local.level((team, CALLS), self.calls)
            if c < n:
                raise _refusal(team, CALLS, (n - c) * PERIOD_MS / 1000 / (self.calls * share))
        if self.cpu_ms:
            u = self.local.level((team, CPU), self.cpu_ms)
            if u <= 0:
                raise _refusal(team, CPU, (1 - u) * PERIOD_MS / 1000 / (self.cpu_ms * share))
        self._debit(team, n, 0)

    def _debit(self, team: str, calls: int, cpu_ms: int) -> None:
        if self.calls and calls:
            self.local.add((team, CALLS), self.calls, calls)
        if self.cpu_ms and cpu_ms:
            self.local.add((team, CPU), self.cpu_ms, cpu_ms)

    async def charge(self, team: str, cpu_ms: int) -> None:
        """Charge the sandbox CPU a tool call used (after it ran)."""
        if self.cpu_ms and cpu_ms > 0:
            await self._run_charge(team, 1, self.cpu_ms, cpu_ms)
            self._debit(team, 0, cpu_ms)

    async def refund(self, team: str, n: int = 1) -> None:
        """Give back ``n`` tool calls ``take`` took for calls that never ran."""
        if self.calls and n > 0:
            await self._run_charge(team, 0, self.calls, -n)
            self._debit(team, -n, 0)

    async def _run_charge(self, team: str, which: int, cap: int, amount: int) -> None:
        if time.monotonic() < self._local_until:
            return  # this process's share holds it; the shared bucket refills meanwhile
        try:
            await self._charge(keys=[bucket_keys(team)[which]], args=[cap, amount, PERIOD_MS])
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        REDIS_ERRORS.labels("quota").inc()
        name = type(exc).__name__
        WARNINGS.warning("envs", "envs quota decided in this process (Redis: %s)", name)
        self._local_until = time.monotonic() + self.retry_s


def _refusal(team: str, quota: str, wait_s: float) -> RateLimited:
    QUOTA_REJECTIONS.labels(team, quota).inc()
    err = RateLimited(
        f"team {team} is over its environments quota ({quota}); retry after {math.ceil(wait_s)} s",
        code="quota_exceeded",
    )
    err.retry_after = wait_s
    return err
