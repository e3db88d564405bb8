"""Batches of episode calls on a team's behalf: the work behind ``/v1/envs/batch/*``
(``ors_batch.py``), importable without FastAPI.

A batch is many ORS calls of one kind (episodes opened, tool calls, episodes ended) in one
request to the envs service (``services/envs/batch.py``), held to what those calls one by
one would be held to, through ``EnvsProxy``'s pieces:

1. ``Idempotency-Key``: the stored answer of an earlier batch with the key (the same route
   and body) is answered again; a new key is claimed, stored on a 200, released otherwise.
2. quota: each episode opened and each tool call takes one from the team's tool-call bucket,
   all at once before the batch is sent (429 for the whole batch, ``Retry-After``).
3. the batch goes to the envs service with the team header, in one of the team's slots,
   within ``GATEWAY_ENVS_TIMEOUT_S``; its answer is relayed as it is.
4. settlement, from the answer: the calls that did not run, and the episodes that did not
   open, get their call back; the sandbox CPU the batch used (its ``usage``) is charged
   and, with its calls, recorded in the usage ledger. An answer other than 200 gives every
   call back.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter as Tally

from starlette.responses import Response

from arbiter.errors import NotConfigured, RateLimited
from arbiter.keys import Principal
from arbiter.proto.common import TEAM_HEADER
from arbiter.services.gateway.envs_proxy import EnvsProxy, _replayed, _stored
from arbiter.services.gateway.idempotency import Claim, Replay, check_key

ENVS_PATH = "v1/batch"  # the envs service's batch routes


class EnvsBatches:
    """``EnvsProxy``'s calls, many at once; built once per app on its proxy."""

    def __init__(self, proxy: EnvsProxy):
        self.proxy = proxy

    async def forward(
        self, who: Principal, op: str, body: bytes, n: int, idempotency_key: str | None
    ) -> Response:
        """The envs service's answer to batch ``op`` (create, call, delete) of ``n`` items
        (``body`` validated by the route), settled (the module docstring)."""
        proxy = self.proxy
        if proxy.url is None:
            raise NotConfigured(
                "environments are not configured on this gateway: set GATEWAY_ENVS_URL "
                "to the envs service (`arbiter serve envs`)",
                code="envs_not_configured",
            )
        idem = proxy.teams.idempotency
        claim: Claim | None = None
        if idempotency_key is not None and idem is not None:
            key = check_key(idempotency_key)
            found = await idem.begin(who.team, key, "POST", f"batch/{op}", body)
            if isinstance(found, Replay):
                await proxy._record(who, Tally(idempotent_replays=1))
                return _replayed(found.body)
            claim = found
        metered = n if op in ("create", "call") else 0
        ok = False
        try:
            if metered and proxy.quota is not None:
                try:
                    await proxy.quota.take(who.team, metered)
                except RateLimited:
                    await proxy._record(who, Tally(rate_limited=1))
                    raise
            answer = None
            try:
                headers = {TEAM_HEADER: who.team, "content-type": "application/json"}
                answer = await proxy._send(
                    "batch", "POST", f"{ENVS_PATH}/{op}", body, headers, who.team
                )
            finally:
                ran = _ran(op, answer) if answer is not None else (0, 0)
                await asyncio.shield(self._settle(who, op, metered, *ran))
            ok = answer.status_code == 200
            if claim is not None and idem is not None and ok:
                await idem.finish(claim, _stored(answer))
            return answer
        finally:
            if not ok:
                await proxy._release(claim)

    async def _settle(self, who: Principal, op: str, taken: int, kept: int, cpu_ms: int) -> None:
        proxy = self.proxy
        if proxy.quota is not None:
            if taken > kept:
                await proxy.quota.refund(who.team, taken - kept)
            if cpu_ms > 0:
                await proxy.quota.charge(who.team, cpu_ms)
        if op == "call" and (kept > 0 or cpu_ms > 0):
            await proxy._record(who, Tally(env_tool_calls=kept, sandbox_cpu_ms=cpu_ms))


def _ran(op: str, answer: Response) -> tuple[int, int]:
    """(calls kept, sandbox CPU ms) of a batch's answer: the calls that ran (``call``) or the
    episodes opened (``create``); (0, 0) for an answer other than 200."""
    if answer.status_code != 200 or op not in ("create", "call"):
        return 0, 0
    try:
        doc = json.loads(bytes(answer.body))
        if op == "create":
            return sum(1 for r in doc["results"] if r.get("sid")), 0
        usage = doc["usage"]
        return max(0, int(usage["tool_calls"])), max(0, int(usage["sandbox_cpu_ms"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return 0, 0  # not the contract: given back, as a call that did not run
