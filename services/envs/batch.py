"""Many episodes in one request (``/v1/batch/*``, behind the gateway's ``/v1/envs/batch/*``):
a trainer's turn of hundreds of episodes as one call to the service, not hundreds.

Each item is what the ORS route does for one episode, through the same steps: ``create``
is ``Envs.create`` with a new sid; a call runs ``Envs._call`` (the tool, the episode saved
only if no other call saved it meanwhile, what it cost) in the episode's turn
(``calls.lock_key``), within ``ENVS_CALL_TIMEOUT_S``. What a batch does in bulk is the
state Redis's work: the items' locks are taken and their episodes read in one round trip,
the locks given back in another, and ``delete`` is one command. An item whose episode is
busy with another call is not waited for: it answers 409 ``session_busy`` (send it again),
so one slow episode never holds the batch. A batch call carries no ``task_id``: a batch
retried whole is the gateway's ``Idempotency-Key`` to replay.

An item that fails answers what the ORS route would have answered for it alone (status
and envelope, ``BatchFailure``) in its place; the others are unaffected.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from arbiter.errors import ArbiterError, Conflict, Timeout, to_envelope
from arbiter.proto.envs import (
    BatchFailure,
    BatchOpened,
    BatchToolCall,
    CreateEpisode,
    ToolCall,
    Usage,
)
from arbiter.services.envs.calls import UNLOCK, lock_key
from arbiter.services.envs.serving import TOOL_CALLS, AfterRun, Envs
from arbiter.services.envs.store import Episode, redis_errors

# Items in flight at once: each holds a connection of the state Redis client's pool (100,
# which the service's other calls use too) while it reads or writes. A request runs
# PER_REQUEST of its items at once, so a batch of slow ones (submits waiting for their
# scoring) holds no other request's items back; all requests together stay below the pool.
PER_REQUEST = 16
CONCURRENCY = 80
A = TypeVar("A")
B = TypeVar("B")


def failure(exc: ArbiterError) -> BatchFailure:
    status, envelope = to_envelope(exc)
    return BatchFailure(status=status, error=envelope.error)


def _failed(exc: ArbiterError) -> str:
    return '{"failed":' + failure(exc).model_dump_json() + "}"


async def bounded(
    gate: asyncio.Semaphore, fn: Callable[[A], Awaitable[B]], items: Sequence[A]
) -> list[B]:
    """``fn`` over ``items``, their results in order, ``PER_REQUEST`` at once, as many as
    ``gate`` (the process's) lets."""
    mine = asyncio.Semaphore(PER_REQUEST)

    async def one(item: A) -> B:
        async with mine, gate:
            return await fn(item)

    return list(await asyncio.gather(*(one(x) for x in items)))


class Batches:
    """Built beside ``Envs`` (``app.state.batches``)."""

    def __init__(self, envs: Envs):
        self.envs = envs
        self.redis = envs.store.redis
        self._unlock = self.redis.register_script(UNLOCK)
        self.gate = asyncio.Semaphore(CONCURRENCY)

    async def create(self, team: str, episodes: list[CreateEpisode]) -> list[BatchOpened]:
        async def one(req: CreateEpisode) -> BatchOpened:
            sid = self.envs.new_sid()
            try:
                await self.envs.create(team, sid, req)
            except ArbiterError as exc:
                return BatchOpened(failed=failure(exc))
            return BatchOpened(sid=sid)

        return await bounded(self.gate, one, episodes)

    async def call(self, team: str, calls: list[BatchToolCall]) -> tuple[list[str], Usage]:
        """Each call's answer as the JSON of a ``BatchCallResult``, in order, and the usage
        of those that ran."""
        sids = [c.sid for c in calls]
        token = secrets.token_hex(8)
        held = await self._lock(team, sids, token)
        try:
            loaded = await self.envs.store.load_many(team, sids)
            pairs = list(zip(calls, loaded, held, strict=True))
            done = await bounded(self.gate, lambda p: self._one(team, *p), pairs)
        finally:
            mine = [sid for sid, h in zip(sids, held, strict=True) if h]
            await asyncio.shield(self._release(team, mine, token))
        usage = Usage(tool_calls=0)
        for _, used in done:
            usage.tool_calls += used.tool_calls
            usage.sandbox_cpu_ms += used.sandbox_cpu_ms
        return [answer for answer, _ in done], usage

    async def delete(self, team: str, sids: list[str]) -> int:
        return await self.envs.store.delete_many(team, sids)

    async def _one(
        self, team: str, call: BatchToolCall, episode: Episode | ArbiterError, held: bool
    ) -> tuple[str, Usage]:
        nothing = Usage(tool_calls=0)
        if not held:
            return _failed(busy(call.sid)), nothing
        if isinstance(episode, ArbiterError):
            return _failed(episode), nothing
        try:
            env = self.envs._env_of(episode, call.env_name)
        except ArbiterError as exc:
            return _failed(exc), nothing
        tool = env.tool(call.name)
        label = tool.name if tool is not None else "(unknown)"  # a caller's names stay out
        one = ToolCall(name=call.name, input=call.input)
        try:
            async with asyncio.timeout(self.envs.settings.call_timeout_s):
                called = await self.envs._call(team, call.sid, episode, env, one)
        except TimeoutError:
            TOOL_CALLS.labels(env.name, label, "timeout").inc()
            late = Timeout(
                f"the tool call did not finish within {self.envs.settings.call_timeout_s:g} s "
                "(ENVS_CALL_TIMEOUT_S); retry",
                code="call_timeout",
            )
            return _failed(late), nothing
        except AfterRun as exc:
            TOOL_CALLS.labels(env.name, label, exc.error.kind).inc()
            return _failed(exc.error), exc.usage
        except ArbiterError as exc:
            TOOL_CALLS.labels(env.name, label, exc.kind).inc()
            return _failed(exc), nothing
        TOOL_CALLS.labels(env.name, label, called.outcome).inc()
        return '{"result":' + called.result + "}", called.usage

    async def _lock(self, team: str, sids: list[str], token: str) -> list[bool]:
        """Each episode's turn, taken now or not at all (a sid twice: its second item not)."""
        ttl_ms = int(self.envs.settings.call_timeout_s * 1000)
        async with redis_errors(), self.redis.pipeline(transaction=False) as pipe:
            for sid in sids:
                pipe.set(lock_key(team, sid), token, nx=True, px=ttl_ms)
            return [bool(x) for x in await pipe.execute()]

    async def _release(self, team: str, sids: list[str], token: str) -> None:
        if not sids:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for sid in sids:
                    await self._unlock(keys=[lock_key(team, sid)], args=[token], client=pipe)
                await pipe.execute()
        except Exception:  # they expire on their own
            return


def busy(sid: str) -> Conflict:
    return Conflict(
        f"X-Session-ID: another call on episode {sid[:64]!r} is running (or this batch has "
        "it twice); send this call again",
        param="X-Session-ID",
        code="session_busy",
    )
