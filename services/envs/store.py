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
"""

from __future__ import annotations

import json
import secrets
from dataclasses import InitVar, dataclass, field
from typing import Any

import redis.asyncio as redis
from redis.exceptions import RedisError

from arbiter.errors import BadRequest, Conflict, NotFound, Unavailable

PREFIX = "arbiter:envs"

SAVE = """
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'version', tostring(tonumber(ARGV[2]) + 1))
redis.call('EXPIRE', KEYS[1], ARGV[3])
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


def not_found(sid: str) -> NotFound:
    return NotFound(
        f"X-Session-ID: no open episode {sid[:64]!r} (never created, deleted, or idle past "
        "its TTL)",
        param="X-Session-ID",
        code="session_not_found",
    )


class Store:
    def __init__(self, url: str, ttl_s: int):
        self.ttl_s = ttl_s
        self.redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5.0)
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
        k = key(team, sid)
        async with redis_errors():
            created = await self.redis.hsetnx(k, "state", episode.dump())
            if created:  # a fresh start: a call still running on a deleted episode of this
                # sid read another version, so its save is refused instead of overwriting
                await self.redis.hset(k, "version", str(secrets.randbelow(2**48)))
            await self.redis.expire(k, self.ttl_s)
        if not created:
            raise BadRequest(
                f"X-Session-ID: episode {sid[:64]!r} exists already; use a new sid",
                param="X-Session-ID",
                code="session_exists",
            )

    async def load(self, team: str, sid: str) -> Episode:
        """The episode, its idle TTL restarted; 404 when there is none."""
        k = key(team, sid)
        async with redis_errors(), self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(k)
            pipe.expire(k, self.ttl_s)
            found, _ = await pipe.execute()
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
            found = (await pipe.execute())[::2]
        return [
            Episode(**json.loads(f["state"]), version=f.get("version", "0"))
            if f and "state" in f
            else not_found(sid)
            for sid, f in zip(sids, found, strict=True)
        ]

    async def save(self, team: str, sid: str, episode: Episode) -> None:
        async with redis_errors():
            done = await self._save(
                keys=[key(team, sid)], args=[episode.dump(), episode.version, self.ttl_s]
            )
        if not done:
            raise Conflict(
                "X-Session-ID: another call on this episode finished first (or it was "
                "deleted); call again with the episode's new state",
                param="X-Session-ID",
                code="session_busy",
            )

    async def touch(self, team: str, sid: str) -> None:
        async with redis_errors():
            alive = await self.redis.expire(key(team, sid), self.ttl_s)
        if not alive:
            raise not_found(sid)

    async def delete(self, team: str, sid: str) -> None:
        async with redis_errors():
            await self.redis.delete(key(team, sid))

    async def delete_many(self, team: str, sids: list[str]) -> int:
        """``delete`` of many episodes in one command: how many were open."""
        async with redis_errors():
            return int(await self.redis.delete(*(key(team, sid) for sid in sids)))


class redis_errors:
    """Redis failing: 503, retryable (the episode is still there once Redis is back)."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, RedisError | OSError):
            raise Unavailable(f"episode state unavailable ({type(exc).__name__})") from exc
