"""The soak's flood-while-Redis-stalls case: a team with a quota of ``RPM`` responses a
minute floods the gateway with one-sample OpenRLHF requests from ``clients`` concurrent
workers, while both Redis (the cache and the state: quotas, ledger) are stopped with
SIGSTOP for ``stall_s`` in the middle and the gateway's Redis pool is cut to 8 connections
(the stack's ``GATEWAY_REDIS_MAX_CONNECTIONS``). Meanwhile another team's clients leave:
some in the middle of sending a body, some while their request is being scored.

Bounds, checked by the caller: answered (200) at most the quota over the flood + 10 %
(a full bucket of ``RPM`` plus its refill), the ledger's requests equal to the answered
ones once Redis is back, and no 5xx from the disconnects: none added on any route but the
flooder's (the gateway's own request counter, ``arbiter_http_request_seconds``, before and
after; the flooder's own 5xx, a component's timeout answered 504, are among its answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.services.soak_stack import usage
from bench.services.soak_up import Up

RPM = 120  # the flooding team's responses_per_minute
SLACK = 0.10  # answered may pass the quota by this fraction, no more
LEDGER_WAIT_S = 30.0  # after Redis is back, the ledger must match within this
RETRY_S = 1.0  # OpenRLHF retries a failed reward call 1 s later
ROUTE = "/v1/compat/openrlhf/{recipe}"  # the flooder's route (template); leavers': /v1/score
PROMPT = "<|im_start|>user\nq {n}: what is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n"


async def request_counts(url: str, admin: str) -> Counter[str]:
    """From the gateway's /metrics: its answers by ``<status> <route>`` (499: the client
    closed), and ``idempotency_dropped``."""
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{url}/metrics", headers={"Authorization": f"Bearer {admin}"})
    r.raise_for_status()
    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if (
                s.name == "arbiter_http_request_seconds_count"
                and s.labels.get("service") == "gateway"
            ):
                out[f"{s.labels.get('status')} {s.labels.get('route')}"] += int(s.value)
            elif s.name == "arbiter_gateway_idempotency_dropped_total":
                out["idempotency_dropped"] += int(s.value)
    return out


async def _worker(http: aiohttp.ClientSession, url: str, stop: asyncio.Event, seed: int,
                  seen: Counter[str], times: list[float]) -> None:  # fmt: skip
    """One OpenRLHF sample per POST, over and over; a refusal is retried 1 s later."""
    rng = random.Random(seed)
    while not stop.is_set():
        a, b = rng.randint(1, 10**6), rng.randint(1, 10**6)
        prompt = PROMPT.format(n=rng.getrandbits(48), a=a, b=b)
        response = f"<think>{a} + {b}</think><answer>{a + b}</answer><|im_end|>"
        body = {"query": [prompt + response], "prompts": [prompt], "labels": [str(a + b)]}
        try:
            async with http.post(f"{url}/v1/compat/openrlhf/gsm8k", json=body) as r:
                doc = await r.json(content_type=None)
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            seen[type(exc).__name__] += 1
            await asyncio.sleep(RETRY_S)
            continue
        times.append(time.monotonic())
        if status == 200:
            seen["200"] += 1
            if doc.get("rewards") != [1.5]:
                seen["wrong"] += 1
            continue
        seen[f"{status} {(doc.get('error') or {}).get('code', '?')}"] += 1
        await asyncio.sleep(RETRY_S)


def _group(n: int) -> dict[str, Any]:
    return {"reference": str(n), "responses": [f"<answer>{n + j}</answer>" for j in range(64)]}


async def _leavers(url: str, key: str, stop: asyncio.Event, seen: Counter[str]) -> None:
    """Clients that go away: half a body then close; a request dropped after 0.3 s."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    rng = random.Random(8)
    async with httpx.AsyncClient(timeout=0.3, headers={"Authorization": f"Bearer {key}"}) as http:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(host, port)
                writer.write(
                    f"POST /v1/score HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n"
                    "content-type: application/json\r\ncontent-length: 4000\r\n\r\n".encode()
                    + b'{"recipe": "gsm8k", "groups": [    '
                )
                await writer.drain()
                await asyncio.sleep(0.2)
                writer.close()
                seen["left mid-body"] += 1
            with contextlib.suppress(httpx.TimeoutException):
                groups = [_group(rng.getrandbits(48)) for _ in range(8)]  # 512 new responses:
                # more than 0.3 s of work, none of it slow, so what runs on is brief
                r = await http.post(f"{url}/v1/score", json={"recipe": "gsm8k", "groups": groups})
                seen[f"answered {r.status_code}"] += 1
                continue
            seen["left while scored"] += 1
            await asyncio.sleep(0.3)


async def _stall(up: Up, at_s: float, stall_s: float, log: dict[str, float], t0: float) -> None:
    await asyncio.sleep(at_s)
    up.signal_redis(signal.SIGSTOP)
    log["stopped_at_s"] = round(time.monotonic() - t0, 2)
    try:
        await asyncio.sleep(stall_s)
    finally:
        up.signal_redis(signal.SIGCONT)
        log["continued_at_s"] = round(time.monotonic() - t0, 2)


async def flood(up: Up, keys: dict[str, str], clients: int, seconds: float,
                stall_s: float) -> dict[str, Any]:  # fmt: skip
    url, admin = up.url, keys["ops"]
    before = await request_counts(url, admin)
    seen: Counter[str] = Counter()
    left: Counter[str] = Counter()
    times: list[float] = []
    stop = asyncio.Event()
    http = aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {keys['flooder']}"},
        connector=aiohttp.TCPConnector(limit=clients),
        timeout=aiohttp.ClientTimeout(total=120),
    )
    t0 = time.monotonic()
    stall_log: dict[str, float] = {}
    tasks = [asyncio.create_task(_worker(http, url, stop, i, seen, times)) for i in range(clients)]
    tasks.append(asyncio.create_task(_leavers(url, keys["leaver"], stop, left)))
    try:
        await asyncio.gather(
            _stall(up, (seconds - stall_s) / 2, stall_s, stall_log, t0), asyncio.sleep(seconds)
        )
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await http.close()
    elapsed = (max(times) if times else time.monotonic()) - t0
    answered = seen["200"]
    allowed = RPM * (1 + elapsed / 60)  # a full bucket, then its refill
    # The ledger, once Redis is back: every answered request, written from the buffer.
    ledger: dict[str, int] = {}
    deadline = time.monotonic() + LEDGER_WAIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError):
            ledger = dict((await asyncio.to_thread(usage, url, admin)).get("flooder", {}))
            if ledger.get("requests", 0) >= answered:
                break
        await asyncio.sleep(1.0)
    after = await request_counts(url, admin)
    return {
        "clients": clients, "seconds": round(elapsed, 1), "redis": stall_log,
        "answers": dict(seen), "answered": answered, "allowed": round(allowed, 1),
        "bound": round(allowed * (1 + SLACK), 1),
        "ledger_requests": ledger.get("requests"),
        "ledger_rate_limited": ledger.get("rate_limited"),
        "leavers": dict(left),
        # The flooder's own 5xx are among its answers above (a component's timeout is a 504);
        # a 5xx on any other route is the leavers': a disconnect counted as a server error.
        "gateway_5xx_added": {k: n for k, n in (after - before).items() if k.startswith("5")},
        "leavers_5xx_added": sum(n for k, n in (after - before).items()
                                 if k.startswith("5") and not k.endswith(ROUTE)),
        "gateway_499_added": sum(n for k, n in (after - before).items() if k.startswith("499")),
    }  # fmt: skip


def checks(out: dict[str, Any]) -> list[tuple[bool, str]]:
    """(held, line) per bound of the flood case."""
    left = out["leavers"].get("left mid-body", 0) + out["leavers"].get("left while scored", 0)
    return [
        (out["answered"] <= out["bound"],
         f"flood: {out['answered']} answered of a {RPM}/min team in {out['seconds']} s with "
         f"Redis stopped {out['redis']}; bound quota + {SLACK:.0%} = {out['bound']}"),
        (out["ledger_requests"] == out["answered"],
         f"flood: ledger {out['ledger_requests']} requests vs {out['answered']} answered "
         f"(must match within {LEDGER_WAIT_S:.0f} s of Redis returning)"),
        (out["answers"].get("wrong", 0) == 0, f"flood: {out['answers'].get('wrong', 0)} wrong"),
        (out["leavers_5xx_added"] == 0 and left > 0,
         f"flood: {out['leavers_5xx_added']} 5xx added outside the flooder's route while "
         f"{left} clients left ({out['gateway_499_added']} answered 499); bound 0"),
    ]  # fmt: skip
