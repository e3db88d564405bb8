"""Per-component score cache: Redis when ``REDIS_URL`` is set, else an in-process LRU.

Values are opaque strings written by the fan-out (a float for a response-level score, a
small JSON document for a group-level result). Only successful scores are ever written.
Redis failures never fail a request: the cache is bypassed for ``redis_retry_s``, the
error is counted (``arbiter_gateway_redis_errors_total``) and logged at most every 30 s,
and the next call after the pause tries Redis again, so it recovers on its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from typing import Any, Protocol

from prometheus_client import Counter
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from arbiter.proto.gateway import ScoreGroup
from arbiter.services.common.throttle import ThrottledLog
from arbiter.services.scoring.recipes import BoundComponent

log = logging.getLogger("arbiter.scoring.cache")
RECOVERED_LOG = ThrottledLog(log, interval_s=30.0)

REDIS_ERRORS = Counter(
    "arbiter_gateway_redis_errors_total", "Redis operations that failed (cache bypassed).", ["op"]
)
CACHE_BYPASSED = Counter(
    "arbiter_gateway_cache_bypassed_total",
    "Cache lookups skipped because Redis failed recently (keys).",
)

KEY_PREFIX = "arb:v1"


def _lp(text: str) -> bytes:
    data = text.encode()
    return b"%d:" % len(data) + data


def _prefix(comp: BoundComponent, group: ScoreGroup) -> Any:
    h = hashlib.sha256(_lp(comp.spec.cache_name) + _lp(comp.params_json) + _lp(group.prompt))
    if group.metadata is not None:  # python_grader reads it; a group without keeps its keys
        h.update(b"M" + _lp(json.dumps(group.metadata, sort_keys=True, separators=(",", ":"))))
    h.update(b"N" if group.reference is None else b"R" + _lp(group.reference))
    return h


def cache_keys(comp: BoundComponent, group: ScoreGroup, team: str | None = None) -> list[str]:
    """One key per response (response-level) or one for the whole ordered group; with a
    ``team``, in that team's own space (``arb:v1:team:<team>:…``), else the shared one. The
    component's ``cache_name`` carries its scoring version."""
    base = _prefix(comp, group)
    name = comp.spec.cache_name if team is None else f"team:{team}:{comp.spec.cache_name}"
    if comp.spec.granularity == "group":
        for text in group.responses:
            base.update(_lp(text))
        return [f"{KEY_PREFIX}:{name}:{base.hexdigest()}"]
    keys = []
    for text in group.responses:
        h = base.copy()
        h.update(text.encode())
        keys.append(f"{KEY_PREFIX}:{name}:{h.hexdigest()}")
    return keys


Value = str | bytes
LOG_EVERY_S = 30.0
CHUNK = 2048
# KEYS: the entries; ARGV[1]: TTL seconds; ARGV[i + 1]: the value of KEYS[i].
SET_EX_LUA = "for i, k in ipairs(KEYS) do redis.call('SET', k, ARGV[i + 1], 'EX', ARGV[1]) end"


class Cache(Protocol):
    kind: str

    async def get_many(self, keys: list[str]) -> list[Value | None]: ...

    async def set_many(self, items: list[tuple[str, str]]) -> None: ...

    async def check(self) -> str: ...

    async def close(self) -> None: ...


class NullCache:
    """GATEWAY_CACHE_ENABLED=false: every lookup misses, nothing is stored."""

    kind = "off"

    async def get_many(self, keys: list[str]) -> list[Value | None]:
        return [None] * len(keys)

    async def set_many(self, items: list[tuple[str, str]]) -> None:
        return None

    async def check(self) -> str:
        return "ok"

    async def close(self) -> None:
        return None


class LRUCache:
    """In-process, per process; bounded by entries, entries expire after the TTL."""

    kind = "lru"

    def __init__(self, max_entries: int, ttl_s: float):
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._data: OrderedDict[str, tuple[float, str]] = OrderedDict()

    async def get_many(self, keys: list[str]) -> list[Value | None]:
        now = time.monotonic()
        out: list[Value | None] = []
        data = self._data
        for key in keys:
            item = data.get(key)
            if item is None:
                out.append(None)
            elif item[0] < now:
                del data[key]
                out.append(None)
            else:
                data.move_to_end(key)
                out.append(item[1])
        return out

    async def set_many(self, items: list[tuple[str, str]]) -> None:
        expires = time.monotonic() + self.ttl_s
        data = self._data
        for key, value in items:
            data[key] = (expires, value)
            data.move_to_end(key)
        while len(data) > self.max_entries:
            data.popitem(last=False)

    async def check(self) -> str:
        return "ok"

    async def close(self) -> None:
        self._data.clear()


class RedisCache:
    """redis.asyncio with a BlockingConnectionPool: one MGET per request for every component,
    and one script call that SETs every new entry with its TTL (a pipeline of SETs cost 2.5x
    the client CPU here). Very large requests are split into chunks of ``CHUNK`` keys."""

    kind = "redis"

    def __init__(
        self, url: str, ttl_s: int, timeout_s: float, max_connections: int, retry_s: float
    ):
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
        self.redis = Redis(connection_pool=pool)
        self._set_ex = self.redis.register_script(SET_EX_LUA)
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._down_until = 0.0
        self._was_down = False
        self._next_log = 0.0
        self._suppressed = 0

    def _bypass(self, n: int) -> bool:
        if self._down_until and time.monotonic() < self._down_until:
            CACHE_BYPASSED.inc(n)
            return True
        return False

    def _failed(self, op: str, exc: BaseException) -> None:
        REDIS_ERRORS.labels(op).inc()
        now = time.monotonic()
        self._down_until = now + self.retry_s
        self._was_down = True
        if now >= self._next_log:
            log.warning(
                "redis %s failed (%s: %s); cache bypassed, retrying after %.1fs "
                "(%d more failures since the last warning)",
                op, type(exc).__name__, exc, self.retry_s, self._suppressed,
            )  # fmt: skip
            self._next_log = now + LOG_EVERY_S
            self._suppressed = 0
        else:
            self._suppressed += 1

    def _succeeded(self) -> None:
        if self._was_down:
            self._was_down = False
            self._down_until = 0.0
            # After a restart every pooled connection fails once: one line, not one each.
            RECOVERED_LOG.warning("recovered", "redis reachable again; cache back on")

    async def get_many(self, keys: list[str]) -> list[Value | None]:
        if not keys or self._bypass(len(keys)):
            return [None] * len(keys)
        try:
            async with asyncio.timeout(self.timeout_s * (1 + len(keys) // CHUNK)):
                if len(keys) <= CHUNK:
                    values: list[Value | None] = await self.redis.mget(keys)
                else:
                    pipe = self.redis.pipeline(transaction=False)
                    for i in range(0, len(keys), CHUNK):
                        pipe.mget(keys[i : i + CHUNK])
                    values = [v for part in await pipe.execute() for v in part]
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("get", exc)
            return [None] * len(keys)
        self._succeeded()
        return values

    async def set_many(self, items: list[tuple[str, str]]) -> None:
        if not items or self._bypass(0):
            return
        try:
            async with asyncio.timeout(self.timeout_s * (1 + len(items) // CHUNK)):
                for i in range(0, len(items), CHUNK):
                    part = items[i : i + CHUNK]
                    await self._set_ex(
                        keys=[k for k, _ in part], args=[self.ttl_s, *(v for _, v in part)]
                    )
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("set", exc)
            return
        self._succeeded()

    async def check(self) -> str:
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.redis.ping()
        except (RedisError, OSError, TimeoutError) as exc:
            return f"degraded: redis unreachable ({type(exc).__name__}); scoring without cache"
        return "ok"

    async def close(self) -> None:
        await self.redis.aclose()
