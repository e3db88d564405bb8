"""What ``/nemo-gym/envs`` keeps between calls, per team: in the state Redis (every replica
sees it), or in this process when the gateway has none.

- ``Sessions``: NeMo Gym's typed sessions. An Environment Server names each session
  (``resources_session_id``); the record holds what it was seeded for (environment,
  ``episode_id``, ``task_id``) and whether it is closed. Its ORS episode's sid is derived
  from the id (``sid_of``), so a repeated seed reaches the same episode and a close deletes
  it without a lookup. A closed id stays closed for ``TTL_S``, a never-seeded one included:
  NeMo Gym closes an id when it cannot tell whether its seed arrived, and a seed that
  arrives after that close must not open an episode nobody will close.
- ``Done``: a finished episode's output, for its ``verify``.

A session record is the contract's state: when Redis fails, the call fails (503, retryable)
rather than falling back to a process that other replicas cannot see. ``Done`` is a cache of
a reward already computed, so it falls back to the process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import OrderedDict
from typing import Any

from fastapi import Request
from redis.exceptions import RedisError

from arbiter.errors import Conflict, Unavailable
from arbiter.proto.nemo_gym import EpisodeId, NemoGymSeedSession

TTL_S = 24 * 3600
LOCAL_MAX = 10_000  # records kept in the process without a state Redis (oldest dropped)
REDIS_ERRORS = (RedisError, OSError, TimeoutError)
_local: OrderedDict[str, bytes] = OrderedDict()


def _keep_local(key: str, value: bytes) -> None:
    _local[key] = value
    _local.move_to_end(key)
    while len(_local) > LOCAL_MAX:
        _local.popitem(last=False)


def sid_of(resources_session_id: str) -> str:
    """The ORS episode's sid of a typed session (at most the 128 characters ORS takes)."""
    return "nemo-gym-" + hashlib.sha256(resources_session_id.encode()).hexdigest()[:40]


def closed_error(resources_session_id: str) -> Conflict:
    return Conflict(
        f"resources_session_id: {resources_session_id[:64]!r} is closed; seed a new id",
        param="resources_session_id",
        code="session_closed",
    )


class Sessions:
    """Typed sessions' records for one team (the module docstring)."""

    def __init__(self, request: Request, team: str):
        self.redis = request.app.state.teams.redis  # redis.asyncio.Redis (bytes), or None
        self.prefix = f"arb:nemo-sessions:v1:{team}:"

    async def seed(self, env_name: str, seed: NemoGymSeedSession) -> None:
        """Record the session, or check that its record is this seed's: a repeated seed of
        an open session passes; a closed one, or one seeded for another episode, is 409."""
        mine = {
            "env": env_name,
            "episode": seed.episode_id.model_dump(),
            "task": seed.task_id.model_dump(),
        }
        held = await self._add(seed.resources_session_id, mine)
        if held is None:
            return
        if held.get("closed"):
            raise closed_error(seed.resources_session_id)
        if held != mine:
            raise Conflict(
                "resources_session_id: seeded already for another environment, episode or task",
                param="resources_session_id",
                code="session_exists",
            )

    async def is_closed(self, resources_session_id: str) -> bool:
        held = await self._get(resources_session_id)
        return held is None or bool(held.get("closed"))

    async def close(self, resources_session_id: str, episode_id: EpisodeId) -> None:
        """Mark the session closed (a tombstone when it was never seeded); 409 when it is
        open for another episode."""
        held = await self._get(resources_session_id)
        if held and not held.get("closed") and held["episode"] != episode_id.model_dump():
            raise Conflict(
                "episode_id: the session is open for another episode",
                param="episode_id",
                code="episode_mismatch",
            )
        await self._put(resources_session_id, {**(held or {}), "closed": True})

    async def _add(self, name: str, value: dict[str, Any]) -> dict[str, Any] | None:
        """Store ``value`` unless the name holds a record: then that record."""
        key, data = self.prefix + name, json.dumps(value).encode()
        if self.redis is None:
            held = _local.get(key)
            if held is None:
                _keep_local(key, data)
            return None if held is None else json.loads(held)
        for _ in range(3):  # a record that expires between SET NX and GET: try again
            try:
                if await self.redis.set(key, data, ex=TTL_S, nx=True):
                    return None
                found = await self.redis.get(key)
            except REDIS_ERRORS as exc:
                raise _unavailable(exc) from exc
            if found is not None:
                return dict(json.loads(found))
        raise Unavailable("NeMo Gym session records: the state Redis keeps dropping the key")

    async def _get(self, name: str) -> dict[str, Any] | None:
        key = self.prefix + name
        if self.redis is None:
            found = _local.get(key)
        else:
            try:
                found = await self.redis.get(key)
            except REDIS_ERRORS as exc:
                raise _unavailable(exc) from exc
        return None if found is None else dict(json.loads(found))

    async def _put(self, name: str, value: dict[str, Any]) -> None:
        key, data = self.prefix + name, json.dumps(value).encode()
        if self.redis is None:
            _keep_local(key, data)
            return
        try:
            await self.redis.set(key, data, ex=TTL_S)
        except REDIS_ERRORS as exc:
            raise _unavailable(exc) from exc


def _unavailable(exc: BaseException) -> Unavailable:
    return Unavailable(f"NeMo Gym session records unavailable ({type(exc).__name__})")


class Done:
    """Finished episodes' outputs, by team and session (the state Redis, else in process)."""

    def __init__(self, request: Request, team: str, sid: str):
        self.redis = request.app.state.teams.redis  # redis.asyncio.Redis (bytes), or None
        self.key = f"arb:nemo-envs:v1:{team}:{sid}"

    async def put(self, output: bytes) -> None:
        if self.redis is not None:
            try:
                await self.redis.set(self.key, output, ex=TTL_S)
                return
            except REDIS_ERRORS:
                pass
        _keep_local(self.key, output)

    async def get(self) -> bytes | None:
        if self.redis is not None:
            try:
                found: bytes | None = await self.redis.get(self.key)
                if found is not None:
                    return found
            except REDIS_ERRORS:
                pass
        return _local.get(self.key)

    async def forget(self) -> None:
        _local.pop(self.key, None)
        if self.redis is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await self.redis.delete(self.key)
