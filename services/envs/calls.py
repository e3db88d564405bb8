"""Tool calls that outlive their request: ORS's ``task_id`` (re-attach and replay), one call
at a time per episode, and the SSE stream that carries a call's answer.

As in ORS's reference server (``ors/_reconnect.py``) and both of its clients, a call is a
task with an id: the answer's first event is ``task_id``; a client whose stream broke sends
the call again with that ``task_id`` and is attached to the same run, or, once it is done,
gets its answer again (kept ``LINGER_S``, 60 s, as the reference server keeps it). The tool
never runs twice for one ``task_id``. Unlike the reference server, the record is in the
state Redis, not in the process: a resend that reaches another replica finds it too.

A call record is a hash, ``arbiter:envs-call:{team}:{sid}:{task_id}``: ``state``
(``running``, ``done``, or ``failed`` for a failure that was not the policy's and left the
episode as it was, so a resend runs the call again), ``answer`` (the ORS result JSON, or
the error envelope), ``usage`` and ``claimed`` (whether a stream has reported the usage to
the gateway yet: the first stream to deliver the answer carries the cost, so a run whose
first stream was cut is charged when its answer is fetched).

Calls on one episode run one at a time (``lock``: ``arbiter:envs-lock:{team}:{sid}``,
waited for in turn), each reading the episode as the one before left it, so a call after
``submit`` is refused without running (``episode_finished``), however many were sent at
once.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, cast

import redis.asyncio as redis

from arbiter.errors import ArbiterError, Timeout, from_response, to_envelope
from arbiter.proto.envs import ERROR_COMMENT, SSE_CHUNK_CHARS, USAGE_COMMENT, Usage
from arbiter.services.envs.store import PREFIX, redis_errors

LINGER_S = 60  # a finished call's answer is kept this long for a resend (ORS's reference)
LOCK_POLL_S = 0.02
ATTACH_POLL_S = 0.1
NOTHING = Usage(tool_calls=0)  # a stream that delivers an answer already reported

BEGIN = """
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'failed' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'running', 'claimed', '0')
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""
# The usage, once: the first stream to deliver the answer reports it.
CLAIM = """
if redis.call('HGET', KEYS[1], 'claimed') ~= '0' then return false end
redis.call('HSET', KEYS[1], 'claimed', '1')
return redis.call('HGET', KEYS[1], 'usage')
"""
UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Outcome:
    """A finished call: the ORS result JSON, or the error of a failure that was not the
    policy's (``retry``: the episode is as it was, so a resend runs the call again)."""

    result: str | None
    error: ArbiterError | None = None
    usage: Usage = field(default_factory=lambda: NOTHING)

    @property
    def state(self) -> str:
        if self.error is not None and self.error.retryable:
            return "failed"
        return "done"

    def answer(self) -> str:
        if self.result is not None:
            return self.result
        assert self.error is not None
        status, body = to_envelope(self.error)
        return f"{status} {body.model_dump_json()}"


def call_key(team: str, sid: str, task_id: str) -> str:
    return f"{PREFIX}-call:{team}:{sid}:{task_id}"


def lock_key(team: str, sid: str) -> str:
    return f"{PREFIX}-lock:{team}:{sid}"


class Calls:
    """The call records and episode locks in the state Redis, and this process's runs."""

    def __init__(self, client: redis.Redis, timeout_s: float):
        self.redis = client
        self.timeout_s = timeout_s
        self._begin = client.register_script(BEGIN)
        self._claim = client.register_script(CLAIM)
        self._unlock = client.register_script(UNLOCK)
        self._runs: dict[str, asyncio.Task[Outcome]] = {}

    async def begin(self, team: str, sid: str, task_id: str) -> bool:
        """True: a new run of this ``task_id`` is ours to start; False: one exists (running,
        or done within ``LINGER_S``): attach to it."""
        ttl = int(self.timeout_s) + LINGER_S
        async with redis_errors():
            return bool(await self._begin(keys=[call_key(team, sid, task_id)], args=[ttl]))

    def start(self, team: str, sid: str, task_id: str, run: Awaitable[Outcome]) -> None:
        """Runs ``run`` to its end whatever happens to the request that started it (a
        resend attaches to it), then stores its outcome."""
        k = call_key(team, sid, task_id)

        async def finish() -> Outcome:
            outcome = await run
            fields: dict[Any, str] = {"state": outcome.state, "answer": outcome.answer()}
            fields["usage"] = outcome.usage.model_dump_json()
            try:
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.hset(k, mapping=fields)
                    pipe.expire(k, LINGER_S)
                    await pipe.execute()
            except Exception:  # this stream still delivers it; a resend runs it again
                pass
            return outcome

        task = asyncio.create_task(finish())
        self._runs[k] = task
        task.add_done_callback(lambda _: self._runs.pop(k, None))

    async def outcome(self, team: str, sid: str, task_id: str) -> Outcome:
        """The call's outcome, waited for: this process's run, else the record (polled)."""
        k = call_key(team, sid, task_id)
        local = self._runs.get(k)
        if local is not None:
            return await asyncio.shield(local)
        async with asyncio.timeout(self.timeout_s + LINGER_S):
            while True:
                async with redis_errors():
                    found = cast(dict[str, str], await self.redis.hgetall(k))
                state = found.get("state")
                if state is None:  # gone: its process died before it finished
                    raise Timeout(
                        f"task_id {task_id!r}: the call's run was lost (a restart); call again "
                        "without task_id",
                        param="task_id",
                        code="call_lost",
                    )
                if state != "running":
                    return _stored(found)
                await asyncio.sleep(ATTACH_POLL_S)

    async def claim(self, team: str, sid: str, task_id: str, outcome: Outcome) -> Usage:
        """The run's usage for the first stream that delivers its answer, else nothing."""
        try:
            found = await self._claim(keys=[call_key(team, sid, task_id)])
        except Exception:  # the record is unreachable: charge it (perhaps twice) rather than not
            return outcome.usage
        return Usage.model_validate_json(found) if found else NOTHING

    @asynccontextmanager
    async def lock(self, team: str, sid: str) -> AsyncIterator[None]:
        """The episode's calls one at a time, each waiting its turn (up to ``timeout_s``)."""
        k, token = lock_key(team, sid), secrets.token_hex(8)
        ttl_ms = int(self.timeout_s * 1000)
        async with asyncio.timeout(self.timeout_s):
            while True:
                async with redis_errors():
                    if await self.redis.set(k, token, nx=True, px=ttl_ms):
                        break
                await asyncio.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            with suppress(Exception):  # it expires on its own
                await self._unlock(keys=[k], args=[token])


def _stored(found: dict[str, str]) -> Outcome:
    usage = Usage.model_validate_json(found.get("usage") or "{}")
    answer = found.get("answer", "")
    if not answer.startswith("{"):  # "<status> <envelope>"
        status, _, body = answer.partition(" ")
        return Outcome(None, from_response(int(status), body.encode()), usage)
    return Outcome(answer, None, usage)


def sse_answer(task_id: str, outcome: Outcome, usage: Usage) -> str:
    """The SSE after ``task_id``: the result in ``chunk`` events, the last one ``end``; or,
    for a call that did not answer, ``ERROR_COMMENT`` and, when trying again cannot help,
    ORS's ``error`` event (a retryable one ends the stream without ``end``, so ORS clients
    send the call again with its ``task_id`` and the run is made again). Then the usage."""
    out = []
    if outcome.result is not None:
        text = outcome.result
        pieces = [text[i : i + SSE_CHUNK_CHARS] for i in range(0, len(text), SSE_CHUNK_CHARS)]
        for i, piece in enumerate(pieces):
            out.append(f"event: {'end' if i == len(pieces) - 1 else 'chunk'}\ndata: {piece}\n\n")
    else:
        assert outcome.error is not None
        out.append(f"{ERROR_COMMENT}{outcome.answer()}\n\n")
        if not outcome.error.retryable:
            message = outcome.error.message.replace("\n", " ")
            out.append(f"event: error\ndata: {message}\n\n")
    out.append(f"{USAGE_COMMENT}{usage.model_dump_json()}\n\n")
    return "".join(out)


async def sse_stream(
    task_id: str, outcome: Awaitable[Outcome], claim: Claimer, keepalive_s: float
) -> AsyncIterator[str]:
    """``task_id`` first, a keep-alive comment every ``keepalive_s`` while the tool runs,
    then ``sse_answer``."""
    yield f"event: task_id\ndata: {task_id}\n\n"
    waiting = asyncio.ensure_future(outcome)
    try:
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=keepalive_s)
            if done:
                break
            yield ": keep-alive\n\n"
        try:
            result = waiting.result()
        except ArbiterError as exc:
            result = Outcome(None, exc)
        yield sse_answer(task_id, result, await claim(result))
    finally:
        waiting.cancel()


class Claimer:
    """``claim`` bound to one call (the stream needs only the outcome)."""

    def __init__(self, calls: Calls, team: str, sid: str, task_id: str):
        self.calls, self.team, self.sid, self.task_id = calls, team, sid, task_id

    async def __call__(self, outcome: Outcome) -> Usage:
        return await self.calls.claim(self.team, self.sid, self.task_id, outcome)
