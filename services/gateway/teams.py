"""One deployment, many teams: the Redis-backed records a scoring call is checked against
and settled into.

``Teams`` is built once at start-up (``app.state.teams``) on its own pool to the state Redis
(``GATEWAY_STATE_REDIS_URL``, else ``REDIS_URL``; apart from the LRU cache) and holds
the quotas (``quota.py``), the usage ledger (``usage.py``) and the idempotency keys
(``idempotency.py``). ``lifecycle.py`` uses them in admission and settlement; the
``/v1/usage`` route reads the ledger through ``usage``. Auth off (no
``GATEWAY_KEYS_FILE``): no quotas and no ledger; idempotency still works when Redis is set.
"""

from __future__ import annotations

from collections import Counter as Tally
from datetime import date

from redis.asyncio import BlockingConnectionPool, Redis

from arbiter.errors import Forbidden
from arbiter.keys import Principal, Team
from arbiter.proto.usage import UsageReport
from arbiter.services.gateway.auth import KeyStore
from arbiter.services.gateway.idempotency import Idempotency
from arbiter.services.gateway.quota import Quota
from arbiter.services.gateway.settings import GatewaySettings
from arbiter.services.gateway.usage import Ledger


class Teams:
    def __init__(self, settings: GatewaySettings, store: KeyStore | None):
        self.store = store
        self.redis: Redis | None = None
        self.quota: Quota | None = None
        self.ledger: Ledger | None = None
        self.idempotency: Idempotency | None = None
        if settings.state_url:  # GATEWAY_STATE_REDIS_URL, else REDIS_URL: never evicts
            pool = BlockingConnectionPool.from_url(
                settings.state_url,
                max_connections=settings.redis_max_connections,
                timeout=settings.redis_timeout_s,
                socket_timeout=settings.redis_timeout_s,
                socket_connect_timeout=settings.redis_timeout_s,
            )
            self.redis = Redis(connection_pool=pool)
            self.idempotency = Idempotency(
                self.redis,
                settings.idempotency_ttl_s,
                settings.idempotency_wait_s,
                settings.idempotency_team_bytes,
            )
            if store is not None:
                self.quota = Quota(
                    self.redis,
                    share=1 / (settings.quota_replicas * settings.processes),
                    per_team=max(1, settings.redis_max_connections // 4),
                    wait_s=settings.quota_wait_s,
                    retry_s=settings.redis_retry_s,
                )
                self.ledger = Ledger(
                    self.redis, settings.usage_retention_days, settings.redis_retry_s
                )

    @property
    def auth(self) -> bool:
        return self.store is not None

    def limits(self, team: str) -> Team:
        """The team's current limits (the keys file as last reloaded)."""
        return self.store.index().teams.get(team, Team()) if self.store else Team()

    async def record(self, team: str | None, counts: Tally[str]) -> None:
        """Add counters to ``team``'s ledger entry (nothing with auth off)."""
        if self.ledger is not None and team is not None:
            await self.ledger.add(team, counts)

    async def charge_judge(self, team: str, tokens: int) -> None:
        if self.quota is not None and tokens > 0:
            await self.quota.charge(Principal(team, None, False, self.limits(team)), tokens)

    async def refund(self, who: Principal, responses: int) -> None:
        if self.quota is not None and responses > 0:
            await self.quota.refund(who, responses)

    async def usage(self, who: Principal, start: date, end: date, team: str | None) -> UsageReport:
        if self.ledger is None:
            return UsageReport(start=start, end=end, days=[])
        if team is not None and team != who.team and not who.admin:
            raise Forbidden(
                f"team: only an admin key reads another team's usage (yours: {who.team})",
                param="team",
                code="admin_only",
            )
        teams = [team] if team is not None else (None if who.admin else [who.team])
        return await self.ledger.report(start, end, teams)

    async def close(self) -> None:
        if self.ledger is not None:
            await self.ledger.close()  # what is still buffered, if Redis answers
        if self.redis is not None:
            await self.redis.aclose()
