"""The usage ledger's buffer on real Redis servers: counts added while Redis is down are
written when it comes up, and a batch whose first write timed out after Redis had applied
it (a stalled Redis) is not counted twice; closing ends its writer whatever Redis does."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter as Tally
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from arbiter.procs import free_port, redis_process
from arbiter.services.gateway.usage import CLOSE_WAIT_S, Ledger, today
from tests.conftest import start_redis

ONE = Tally(requests=1, responses=2, cache_misses=4)


def pending() -> float:
    return REGISTRY.get_sample_value("arbiter_gateway_usage_pending") or 0


async def totals(ledger: Ledger, team: str) -> dict[str, int]:
    report = await ledger.report(today(), today(), [team])
    return {k: v for d in report.days for k, v in d.model_dump().items() if isinstance(v, int)}


@pytest.fixture
async def down() -> AsyncIterator[tuple[Redis, int]]:
    """A client of a Redis port that nothing serves yet."""
    port = free_port()
    redis = Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.3)
    yield redis, port
    await redis.aclose()


async def test_usage_added_while_redis_is_down_is_written_when_it_returns(
    down: tuple[Redis, int], log_dir: Path
) -> None:
    redis, port = down
    ledger = Ledger(redis, retention_days=1, retry_s=0.1)
    before = pending()
    for _ in range(5):
        await ledger.add("buffered", ONE)
    assert not await ledger.flush()  # nothing listens: kept
    assert pending() == before + 5
    proc = redis_process(port, log_path=log_dir / f"redis-{port}.log")
    proc.start().wait_ready(10)
    try:
        for _ in range(50):  # the writer task retries every 0.1 s on its own
            if pending() == before:
                break
            await asyncio.sleep(0.1)
        assert pending() == before
        got = await totals(ledger, "buffered")
        assert (got["requests"], got["responses"], got["cache_misses"]) == (5, 10, 20)
        await ledger.close()
    finally:
        proc.stop()


async def test_a_batch_applied_by_a_stalled_redis_is_not_counted_twice(log_dir: Path) -> None:
    proc, url = start_redis(log_dir)
    assert proc.proc is not None
    redis = Redis.from_url(url, socket_timeout=0.3)
    ledger = Ledger(redis, retention_days=1, retry_s=60)  # the test writes, not the task
    try:
        await ledger.add("stalled", ONE)
        await ledger.add("stalled", ONE)
        os.kill(proc.proc.pid, signal.SIGSTOP)
        try:
            assert not await ledger.flush()  # sent, then timed out: applied or not?
        finally:
            os.kill(proc.proc.pid, signal.SIGCONT)
        # Redis, running again, applied the write that timed out: the case under test
        checker = Redis.from_url(url)
        try:
            for _ in range(50):
                if await checker.keys("arb:usage:v2:batch:*"):
                    break
                await asyncio.sleep(0.05)
            assert len(await checker.keys("arb:usage:v2:batch:*")) == 1
        finally:
            await checker.aclose()
        await ledger.add("stalled", ONE)
        assert await ledger.flush()  # that batch again (a no-op), then the new one
        got = await totals(ledger, "stalled")
        assert (got["requests"], got["responses"]) == (3, 6)
        await ledger.close()
    finally:
        await redis.aclose()
        proc.stop()


async def test_close_ends_the_writer_even_when_redis_answers_a_cancel_with_an_error() -> None:
    # The Redis client can answer a cancel that lands mid-command with a connection error
    # or a timeout (a fault a real server cannot be made to cause on demand: a stand-in
    # client does it here). The writer used to catch that as "Redis failed", loop, and
    # wait forever, and close() with it: the gateway would never finish shutting down.
    class CancelIntoTimeout:
        def register_script(self, _script: str) -> object:
            async def call(**_: object) -> None:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    raise TimeoutError("Timeout reading from socket") from None

            return call

    ledger = Ledger(CancelIntoTimeout(), retention_days=1)  # type: ignore[arg-type]
    await ledger.add("team", Tally(requests=1))
    await asyncio.sleep(0.05)  # the writer is inside the Redis call
    closing = asyncio.create_task(ledger.close())
    await asyncio.wait({closing}, timeout=CLOSE_WAIT_S + 2)  # not a timeout: it cannot end one
    assert closing.done(), "close() still waits for the writer"
    assert ledger._writer is not None and ledger._writer.done()
