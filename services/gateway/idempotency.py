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

**A team's stored answers are bounded** by ``GATEWAY_IDEMPOTENCY_TEAM_BYTES``. They live in
the state Redis (``GATEWAY_STATE_REDIS_URL``: ``noeviction``, so nothing else bounds them),
and each team's are listed in the order they were stored (``arb:idem-order:v1:<team>``, a
sorted set by store time, with the sizes in ``arb:idem-bytes:v1:<team>``). Storing an
answer that would take the team past its budget first drops the team's oldest stored
answers, in one script run: a retry of a dropped one is scored afresh (like one past its
TTL), never answered wrong. An answer larger than the whole budget is not stored and its
key is released. Only the storing team's entries are ever dropped
(``arbiter_gateway_idempotency_dropped_total``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from arbiter.errors import BadRequest, Conflict, Unprocessable
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.scoring.cache import REDIS_ERRORS

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
# Store an answer within the team's byte budget. KEYS: the entry, the team's order (sorted
# set: entry -> store time in ms), its sizes (hash: entry -> bytes, "total" -> their sum).
# ARGV: the stored value, its TTL in s, the budget in bytes, our pending value. Entries past
# their TTL are forgotten first, then the oldest dropped until the answer fits. Returns the
# number of answers dropped, or -1 when the answer alone is over the budget (not stored, the
# claim released). The entries named in the order are the team's own keys (one Redis, not
# a cluster: a script may touch them).
FINISH_LUA = """
local value, ttl, budget = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local size = #value
if size > budget then
  if redis.call('GET', KEYS[1]) == ARGV[4] then redis.call('DEL', KEYS[1]) end
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local total = tonumber(redis.call('HGET', KEYS[3], 'total') or '0')
local function forget(entry)
  total = total - tonumber(redis.call('HGET', KEYS[3], entry) or '0')
  redis.call('HDEL', KEYS[3], entry)
  redis.call('ZREM', KEYS[2], entry)
end
for _, entry in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl * 1000)) do
  forget(entry)
end
forget(KEYS[1])
local dropped = 0
while total + size > budget do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then break end
  redis.call('DEL', oldest[1])
  forget(oldest[1])
  dropped = dropped + 1
end
redis.call('SET', KEYS[1], value, 'EX', ttl)
redis.call('ZADD', KEYS[2], now, KEYS[1])
redis.call('HSET', KEYS[3], KEYS[1], size, 'total', total + size)
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('EXPIRE', KEYS[3], ttl)
return dropped
"""
# Delete the entry only if it is still our pending claim.
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


DROPPED = Counter(
    "arbiter_gateway_idempotency_dropped_total",
    "Stored Idempotency-Key answers dropped to keep a team within "
    "GATEWAY_IDEMPOTENCY_TEAM_BYTES (reason=budget: the team's oldest; too_large: an answer "
    "over the whole budget, not stored)",
    ["reason"],
)


@dataclass(frozen=True)
class Claim:
    """This request holds the key: ``finish`` with its answer, or ``release`` it."""

    entry: str
    pending: bytes
    team: str


@dataclass(frozen=True)
class Replay:
    body: bytes


def budget_keys(team: str) -> list[str]:
    """The team's order of stored answers and their sizes (``FINISH_LUA``'s KEYS[2:])."""
    return [f"arb:idem-order:v1:{team}", f"arb:idem-bytes:v1:{team}"]


def check_key(value: str) -> str:
    if not 1 <= len(value) <= MAX_KEY_CHARS or not value.isascii() or not value.isprintable():
        raise BadRequest(
            f"{HEADER}: 1 to {MAX_KEY_CHARS} printable ASCII characters (a UUID is typical)",
            param=HEADER,
            code="invalid_idempotency_key",
        )
    return value


class Idempotency:
    def __init__(self, redis: Redis, ttl_s: int, wait_s: float, team_bytes: int):
        self.redis = redis
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self.team_bytes = team_bytes
        self._claim = redis.register_script(CLAIM_LUA)
        self._finish = redis.register_script(FINISH_LUA)
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
                found = await self._try_claim(team, entry, pending)
                if found is None:
                    return Claim(entry, pending, team)
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

    async def _try_claim(self, team: str, entry: str, pending: bytes) -> bytes | None:
        """One claim round trip. If the request is cancelled (its client left) while the
        script is on its way, the claim may still have been made: it is released as soon as
        the script's answer arrives, so a retry never waits for a claim nobody holds."""
        call = asyncio.ensure_future(self._claim(keys=[entry], args=[pending, PENDING_TTL_S]))
        try:
            found: bytes | None = await asyncio.shield(call)
        except asyncio.CancelledError:

            def undo(done: asyncio.Future[bytes | None]) -> None:
                if not done.cancelled() and done.exception() is None and done.result() is None:
                    task = asyncio.ensure_future(self.release(Claim(entry, pending, team)))
                    self._undoing.add(task)
                    task.add_done_callback(self._undoing.discard)

            call.add_done_callback(undo)
            raise
        return found

    async def finish(self, claim: Claim, body: bytes) -> None:
        """Store the answer for ``ttl_s`` within the team's byte budget; replaces the
        pending claim."""
        try:
            dropped = await self._finish(
                keys=[claim.entry, *budget_keys(claim.team)],
                args=[b"D" + claim.pending[1:] + body, self.ttl_s, self.team_bytes, claim.pending],
            )
            if dropped < 0:
                DROPPED.labels("too_large").inc()
                log.info(
                    "team %s: answer of %d bytes is over GATEWAY_IDEMPOTENCY_TEAM_BYTES (%d); "
                    "not stored for its key",
                    claim.team,
                    len(body),
                    self.team_bytes,
                )
            elif dropped:
                DROPPED.labels("budget").inc(dropped)
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
