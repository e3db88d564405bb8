"""``Idempotency-Key`` on ``POST /v1/score``, as payment APIs use it.

- The first request with a key claims it in Redis (``pending`` + a hash of its method, path
  and body) and is scored; its 200 answer is stored under the key for
  ``GATEWAY_IDEMPOTENCY_TTL_S`` (24 h). A request that fails (4xx, 5xx, 429) or whose
  client went away releases the key, so a retry is scored afresh.
- The same key with the same body again: the stored answer, byte for byte, with
  ``Idempotent-Replayed: true``; not scored, not counted in usage or quota again.
- The same key with another body: 422 ``idempotency_key_reused``.
- The same key while the first is still being scored (a client that retried after its
  connection dropped, before the gateway noticed): the duplicate waits for the first, up to
  ``GATEWAY_IDEMPOTENCY_WAIT_S``, and answers with its stored response (or is scored
  itself if the first failed); past the wait, 409 ``idempotency_in_flight``.

Keys are scoped per team (``arb:idem:v1:<team>:<sha256(key)>``): two teams can never
collide or read each other's answers. A pending claim expires after ``PENDING_TTL_S``, so a
gateway that died mid-request does not hold a key for a day. If Redis fails the request is
scored without the guarantee (``arbiter_gateway_redis_errors_total{op="idempotency"}``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from arbiter.errors import BadRequest, Conflict, Unprocessable
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.gateway.cache import REDIS_ERRORS

log = logging.getLogger("arbiter.gateway.idempotency")
WARNINGS = ThrottledLog(log)  # one line per 10 s during a Redis outage, with a count

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY_CHARS = 255
PENDING_TTL_S = 900  # longer than any request may run (the judge's 120 s deadline, queues)
POLL_S = 0.05

# KEYS[1]: the key's entry. ARGV: the pending value, its TTL. Returns the entry that was
# there (nil when this call claimed it).
CLAIM_LUA = """
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return false
"""
# Delete the entry only if it is still our pending claim.
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Claim:
    """This request holds the key: ``finish`` with its answer, or ``release`` it."""

    entry: str
    pending: bytes


@dataclass(frozen=True)
class Replay:
    body: bytes


def check_key(value: str) -> str:
    if not 1 <= len(value) <= MAX_KEY_CHARS or not value.isascii() or not value.isprintable():
        raise BadRequest(
            f"{HEADER}: 1 to {MAX_KEY_CHARS} printable ASCII characters (a UUID is typical)",
            param=HEADER,
            code="invalid_idempotency_key",
        )
    return value


class Idempotency:
    def __init__(self, redis: Redis, ttl_s: int, wait_s: float):
        self.redis = redis
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self._claim = redis.register_script(CLAIM_LUA)
        self._release = redis.register_script(RELEASE_LUA)
        self._undoing: set[asyncio.Task[None]] = set()

    async def begin(
        self, team: str, key: str, method: str, path: str, body: bytes
    ) -> Claim | Replay | None:
        """Claim ``key`` for this request, or the stored answer of an earlier one; None when
        Redis failed (score without the guarantee)."""
        digest = hashlib.sha256(key.encode()).hexdigest()
        entry = f"arb:idem:v1:{team}:{digest}"
        fingerprint = hashlib.sha256(f"{method} {path}\n".encode() + body).hexdigest().encode()
        pending = b"P" + fingerprint
        deadline = time.monotonic() + self.wait_s
        try:
            while True:
                found = await self._try_claim(entry, pending)
                if found is None:
                    return Claim(entry, pending)
                state, stored, rest = found[:1], found[1:65], found[65:]
                if stored != fingerprint:
                    raise Unprocessable(
                        f"{HEADER}: this key was used with a different request body; a "
                        "retry must send the same body, a new request a new key",
                        param=HEADER,
                        code="idempotency_key_reused",
                    )
                if state == b"D":
                    return Replay(rest)
                if time.monotonic() >= deadline:
                    raise Conflict(
                        f"{HEADER}: a request with this key is still being scored; retry "
                        "after it finishes",
                        param=HEADER,
                        code="idempotency_in_flight",
                    )
                await asyncio.sleep(POLL_S)
        except (RedisError, OSError, TimeoutError) as exc:
            REDIS_ERRORS.labels("idempotency").inc()
            WARNINGS.warning(
                "begin", "idempotency check failed (%s); scoring without it", type(exc).__name__
            )
            return None

    async def _try_claim(self, entry: str, pending: bytes) -> bytes | None:
        """One claim round trip. If the request is cancelled (its client left) while the
        script is on its way, the claim may still have been made: it is released as soon as
        the script's answer arrives, so a retry never waits for a claim nobody holds."""
        call = asyncio.ensure_future(self._claim(keys=[entry], args=[pending, PENDING_TTL_S]))
        try:
            found: bytes | None = await asyncio.shield(call)
        except asyncio.CancelledError:

            def undo(done: asyncio.Future[bytes | None]) -> None:
                if not done.cancelled() and done.exception() is None and done.result() is None:
                    task = asyncio.ensure_future(self.release(Claim(entry, pending)))
                    self._undoing.add(task)
                    task.add_done_callback(self._undoing.discard)

            call.add_done_callback(undo)
            raise
        return found

    async def finish(self, claim: Claim, body: bytes) -> None:
        """Store the answer for ``ttl_s``; replaces the pending claim."""
        try:
            await self.redis.set(claim.entry, b"D" + claim.pending[1:] + body, ex=self.ttl_s)
        except (RedisError, OSError, TimeoutError) as exc:
            REDIS_ERRORS.labels("idempotency").inc()
            WARNINGS.warning("finish", "answer not stored for its key (%s)", type(exc).__name__)

    async def release(self, claim: Claim) -> None:
        """Give the key up (the request failed or was cancelled): a retry is scored afresh."""
        try:
            await self._release(keys=[claim.entry], args=[claim.pending])
        except (RedisError, OSError, TimeoutError) as exc:
            REDIS_ERRORS.labels("idempotency").inc()
            WARNINGS.warning("release", "key not released (%s)", type(exc).__name__)
