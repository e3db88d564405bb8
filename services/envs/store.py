"""Episodes in Redis (the gateway's state Redis), per team, with an idle TTL.

One hash per episode, ``arbiter:envs:{team}:{sid}``: ``state`` (JSON: environment, task,
what its tools keep between calls, finished) and ``version``. The key holds the team, so a
sid is found only under the team that created it: another team's sid is a 404, as an
unknown one is. Every touch (create, prompt, call, ping) sets the key's expiry to
``ENVS_SESSION_TTL_S``: an episode nobody touches that long is gone. Nothing lives in the
process, so a restarted process, or another replica, serves the next call of any open
episode (python's interpreter lives in the sandbox: ``interpreters.py``).

A call reads the state, runs the tool, then writes the new state only if the version is
still the one it read (``SAVE``, one Lua script): of two calls racing on one episode, the
second is refused with 409 instead of losing the first's effect or submit.

**A team's open episodes are bounded in bytes** (``ENVS_TEAM_EPISODE_BYTES``), as its
stored answers are: the state Redis is ``noeviction``, and a ``code`` episode holds its
task, up to a few hundred KB. Each team's open episodes are listed with their last touch
(``arbiter:envs-budget:touched:{team}``, a sorted set) and their sizes
(``arbiter:envs-budget:bytes:{team}``, and their running total); ``/create`` first forgets
the team's episodes idle past the TTL (Redis has expired them), then opens the new one only
if the team's total stays within its budget (``CREATE``, one script, its cost independent
of how many episodes are open): past it, 429 ``episodes_over_budget`` for that team alone.
An episode's size is taken when it opens: what changes after (a finished flag, the
interpreter's handle) is small.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import InitVar, dataclass, field
from typing import Any

import redis.asyncio as redis
from redis.exceptions import RedisError

from arbiter.errors import BadRequest, Conflict, NotFound, RateLimited, Unavailable

PREFIX = "arbiter:envs"
BUDGET = "arbiter:envs-budget"

# KEYS: the episode, the team's touches, the team's sizes, the team's total. ARGV: the
# state, its version, the TTL in s, now in ms, the team's budget in bytes, the sid. Returns
# {-1, 0} when the episode exists, {-2, total} past the budget, else {0, the new total}.
CREATE = """
local idle = tonumber(ARGV[4]) - tonumber(ARGV[3]) * 1000
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. idle)) do
  redis.call('ZREM', KEYS[2], gone)
  local size = redis.call('HGET', KEYS[3], gone)
  if size then
    redis.call('HDEL', KEYS[3], gone)
    redis.call('DECRBY', KEYS[4], size)
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
local total = tonumber(redis.call('GET', KEYS[4]) or '0')
local size = string.len(ARGV[1])
if total + size > tonumber(ARGV[5]) then return {-2, total} end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'version', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[6])
redis.call('HSET', KEYS[3], ARGV[6], size)
return {0, redis.call('INCRBY', KEYS[4], size)}
"""
# KEYS: the team's touches, sizes and total, then the episodes. ARGV: their sids. Returns
# how many episodes were open.
DELETE = """
for i, sid in ipairs(ARGV) do
  redis.call('ZREM', KEYS[1], sid)
  local size = redis.call('HGET', KEYS[2], sid)
  if size then
    redis.call('HDEL', KEYS[2], sid)
    redis.call('DECRBY', KEYS[3], size)
  end
end
return redis.call('DEL', unpack(KEYS, 4))
"""
SAVE = """
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'version', tostring(tonumber(ARGV[2]) + 1))
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], 'XX', ARGV[4], ARGV[5])
return 1
"""


@dataclass
class Episode:
    env: str
    task: dict[str, Any]
    # what the environment's tools keep between calls (python: its interpreter's handle)
    tool_state: dict[str, str] = field(default_factory=dict)
    finished: bool = False
    calls: int = 0
    version: str = "0"
    cells: InitVar[Any] = None  # an episode saved when python kept its cells: read, dropped

    def dump(self) -> str:
        return json.dumps(
            {
                "env": self.env,
                "task": self.task,
                "tool_state": self.tool_state,
                "finished": self.finished,
                "calls": self.calls,
            }
        )


def key(team: str, sid: str) -> str:
    return f"{PREFIX}:{team}:{sid}"


def touched_key(team: str) -> str:
    return f"{BUDGET}:touched:{team}"


def sizes_key(team: str) -> str:
    return f"{BUDGET}:bytes:{team}"


def budget_keys(team: str) -> list[str]:
    """The team's touches, sizes and their total (the budget's keys, in scripts' order)."""
    return [touched_key(team), sizes_key(team), f"{BUDGET}:total:{team}"]


def now_ms() -> int:
    return int(time.time() * 1000)


def not_found(sid: str) -> NotFound:
    return NotFound(
        f"X-Session-ID: no open episode {sid[:64]!r} (never created, deleted, or idle past "
        "its TTL)",
        param="X-Session-ID",
        code="session_not_found",
    )


class Store:
    def __init__(self, url: str, ttl_s: int, team_bytes: int):
        self.ttl_s = ttl_s
        self.team_bytes = team_bytes
        self.redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5.0)
        self._create = self.redis.register_script(CREATE)
        self._delete = self.redis.register_script(DELETE)
        self._save = self.redis.register_script(SAVE)

    async def close(self) -> None:
        await self.redis.aclose()

    async def check(self) -> str:
        try:
            await self.redis.ping()
        except (RedisError, OSError) as exc:
            return f"unreachable ({type(exc).__name__})"
        return "ok"

    async def create(self, team: str, sid: str, episode: Episode) -> None:
        """Opens the episode at a random version (a call still running on a deleted
        episode of this sid read another, so its save is refused instead of overwriting),
        within the team's byte budget."""
        keys = [key(team, sid), *budget_keys(team)]
        version = str(secrets.randbelow(2**48))
        args: list[str | int] = [
            episode.dump(),
            version,
            self.ttl_s,
            now_ms(),
            self.team_bytes,
            sid,
        ]
        async with redis_errors():
            code, total = await self._create(keys=keys, args=args)
        if code == -1:
            raise BadRequest(
                f"X-Session-ID: episode {sid[:64]!r} exists already; use a new sid",
                param="X-Session-ID",
                code="session_exists",
            )
        if code == -2:
            over = RateLimited(
                f"this team's open episodes hold {int(total):,} bytes; this one would take "
                f"them past ENVS_TEAM_EPISODE_BYTES ({self.team_bytes:,}): delete finished "
                "episodes (POST /delete), or retry once idle ones expire",
                code="episodes_over_budget",
            )
            over.retry_after = 60.0
            raise over

    async def load(self, team: str, sid: str) -> Episode:
        """The episode, its idle TTL restarted; 404 when there is none."""
        k = key(team, sid)
        async with redis_errors(), self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(k)
            pipe.expire(k, self.ttl_s)
            pipe.zadd(touched_key(team), {sid: now_ms()}, xx=True)
            found, _, _ = await pipe.execute()
        if not found or "state" not in found:
            raise not_found(sid)
        state = json.loads(found["state"])
        return Episode(**state, version=found.get("version", "0"))

    async def load_many(self, team: str, sids: list[str]) -> list[Episode | NotFound]:
        """``load`` of many episodes in one round trip (a batch's); a missing one's 404 in
        its place."""
        async with redis_errors(), self.redis.pipeline(transaction=False) as pipe:
            for sid in sids:
                pipe.hgetall(key(team, sid))
                pipe.expire(key(team, sid), self.ttl_s)
            pipe.zadd(touched_key(team), dict.fromkeys(sids, now_ms()), xx=True)
            found = (await pipe.execute())[:-1:2]
        return [
            Episode(**json.loads(f["state"]), version=f.get("version", "0"))
            if f and "state" in f
            else not_found(sid)
            for sid, f in zip(sids, found, strict=True)
        ]

    async def save(self, team: str, sid: str, episode: Episode) -> None:
        async with redis_errors():
            done = await self._save(
                keys=[key(team, sid), touched_key(team)],
                args=[episode.dump(), episode.version, self.ttl_s, now_ms(), sid],
            )
        if not done:
            raise Conflict(
                "X-Session-ID: another call on this episode finished first (or it was "
                "deleted); call again with the episode's new state",
                param="X-Session-ID",
                code="session_busy",
            )

    async def touch(self, team: str, sid: str) -> None:
        async with redis_errors(), self.redis.pipeline(transaction=True) as pipe:
            pipe.expire(key(team, sid), self.ttl_s)
            pipe.zadd(touched_key(team), {sid: now_ms()}, xx=True)
            alive, _ = await pipe.execute()
        if not alive:
            raise not_found(sid)

    async def delete(self, team: str, sid: str) -> None:
        await self.delete_many(team, [sid])

    async def delete_many(self, team: str, sids: list[str]) -> int:
        """``delete`` of many episodes in one round trip: how many were open."""
        keys = [*budget_keys(team), *(key(team, sid) for sid in sids)]
        async with redis_errors():
            return int(await self._delete(keys=keys, args=sids))


class redis_errors:
    """Redis failing: 503, retryable (the episode is still there once Redis is back)."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, RedisError | OSError):
            raise Unavailable(f"episode state unavailable ({type(exc).__name__})") from exc
