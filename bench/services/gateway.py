"""Gateway overhead: (b) added latency against calling verify directly; (c) cached hits/s.

(b) Sequential requests, one group of 8 GSM8K-like responses each, every response made
unique per request (a nonce in the text) so nothing comes from a cache. The same payload
goes to verify directly and through the gateway, interleaved, over one keep-alive
connection each:
  - ``math``: inline recipe ``[math_accuracy]`` vs ``POST /v1/math``;
  - ``gsm8k``: recipe ``gsm8k`` (math + format, fanned out concurrently) vs ``/v1/math``
    and ``/v1/format`` sent concurrently by the client.
Both through a gateway with Redis (a miss costs one MGET + one pipelined SET) and through
one with the cache off.
(c) Cached-hit throughput: every group is scored once, then concurrent clients send only
those groups again (all hits, Redis), one group of 8 per request, and 8 groups per request.

The client is a minimal HTTP/1.1 keep-alive client on asyncio streams, so that on a
2-core machine the load generator takes as little CPU from the gateway as possible.

``--baseline DIR`` also starts the gateways of another checkout (e.g. ``git worktree add
/tmp/before HEAD~3``) as ``before+redis`` / ``before no-cache`` and times them in the same
interleaved rounds, so a change to the gateway is compared on the same machine and load.

    .venv/bin/python -m bench.services.gateway [--verify-url URL] [--requests 300] [--seconds 5]
        [--baseline DIR] [--json PATH]

``run(...)`` returns the numbers as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from arbiter.procs import (
    ManagedProcess,
    free_port,
    redis_process,
    service_process,
    uvicorn_process,
    wait_port,
)
from bench import record
from bench.services.procstat import cpu_seconds
from bench.services.verify import load_groups

log = logging.getLogger("bench.services.gateway")


def _header_lines(headers: dict[str, str] | None) -> str:
    return "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())


class RawClient:
    """One keep-alive HTTP/1.1 connection; POST JSON bytes, get (status, body bytes).

    ``headers`` go with every request, ``post(..., headers=)`` with that one."""

    def __init__(self, url: str, headers: dict[str, str] | None = None):
        host, port = url.removeprefix("http://").split(":")
        self.host, self.port = host, int(port)
        self.head = _header_lines(headers)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(
        self, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{self.head}{_header_lines(headers)}\r\n"
        )
        self.writer.write(head.encode() + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        length = 0
        for line in raw.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _unique(group: dict[str, Any], nonce: int) -> dict[str, Any]:
    """The same group with every response made unique (a nonce inside the reasoning)."""
    out = []
    for r in group["responses"]:
        tagged = "<think>" in r
        out.append(r.replace("<think>", f"<think>[{nonce}] ", 1) if tagged else f"[{nonce}] {r}")
    return {**group, "responses": out}


async def _latency(
    verify: str, gateways: dict[str, str], groups: list[dict[str, Any]], n: int
) -> dict[str, dict[str, float]]:
    direct = RawClient(verify)
    direct2 = RawClient(verify)
    gws = {name: RawClient(url) for name, url in gateways.items()}
    math_only = {"components": [{"name": "math_accuracy", "weight": 1.0}]}
    times: dict[str, list[float]] = {}
    rng = random.Random(1)

    async def timed(key: str, call: Callable[[], Awaitable[Any]]) -> None:
        start = time.perf_counter()
        results = await call()
        times.setdefault(key, []).append((time.perf_counter() - start) * 1000)
        for status, _ in results if isinstance(results, list) else [results]:
            assert status == 200, (key, status)

    async def math_and_format(body: bytes) -> list[tuple[int, bytes]]:
        pair = await asyncio.gather(direct.post("/v1/math", body), direct2.post("/v1/format", body))
        return list(pair)

    for i in range(n + 20):  # the first 20 rounds warm up and are dropped
        g = _unique(groups[i % len(groups)], i)
        comp = json.dumps({"groups": [g], "params": {}}).encode()
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("direct math", partial(direct.post, "/v1/math", comp)),
            ("direct math+format", partial(math_and_format, comp)),
        ]
        for k, (name, client) in enumerate(gws.items()):
            # fresh nonces per gateway and recipe: no gateway ever sees a response twice
            gm = _unique(groups[i % len(groups)], (i * 10 + k) * 2)
            gs = _unique(groups[i % len(groups)], (i * 10 + k) * 2 + 1)
            b1 = json.dumps({"recipe": math_only, "groups": [gm]}).encode()
            b2 = json.dumps({"recipe": "gsm8k", "groups": [gs]}).encode()
            steps.append((f"{name} math", partial(client.post, "/v1/score", b1)))
            steps.append((f"{name} gsm8k", partial(client.post, "/v1/score", b2)))
        rng.shuffle(steps)
        for key, call in steps:
            await timed(key, call)
        if i == 19:
            times.clear()
    for c in (direct, direct2, *gws.values()):
        await c.close()
    return {
        k: {"p50_ms": statistics.median(v), "p99_ms": _pct(v, 0.99), "n": len(v)}
        for k, v in times.items()
    }


async def _throughput(
    gateway: str, groups: list[dict[str, Any]], per_request: int, clients: int, seconds: float
) -> dict[str, float]:
    bodies = [
        json.dumps({"recipe": "gsm8k", "groups": groups[i : i + per_request]}).encode()
        for i in range(0, len(groups) - per_request + 1, per_request)
    ]
    warm = RawClient(gateway)
    for body in bodies:  # score everything once: from now on every request is all hits
        status, _ = await warm.post("/v1/score", body)
        assert status == 200
    await warm.close()
    done = [0]
    misses = [0]
    stop = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        client = RawClient(gateway)
        i = k
        while time.perf_counter() < stop:
            status, body = await client.post("/v1/score", bodies[i % len(bodies)])
            assert status == 200
            if b'"cache_misses":0,' not in body:
                misses[0] += 1
            done[0] += 1
            i += 1
        await client.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    elapsed = time.perf_counter() - start
    responses = done[0] * per_request * 8
    return {
        "seconds": elapsed,
        "requests_per_s": done[0] / elapsed,
        "responses_per_s": responses / elapsed,
        "requests_with_misses": misses[0],
    }


def started(stack: ExitStack, proc: ManagedProcess, timeout: float = 120) -> ManagedProcess:
    """``proc`` started and ready; stopped when ``stack`` closes."""
    proc.start()
    stack.callback(proc.stop)
    proc.wait_ready(timeout)
    return proc


@contextmanager
def _stack(
    verify_url: str | None, workdir: Path, baseline: Path | None = None
) -> Iterator[tuple[dict[str, str], dict[str, int]]]:
    with ExitStack() as stack:
        start = partial(started, stack)

        if verify_url is None:
            port = free_port()
            verify = service_process(
                "verify", port, env={"VERIFY_WORKERS": "2"}, log_path=workdir / "verify.log",
                ready_path="/readyz",
            )  # fmt: skip
            start(verify)
            verify_url = f"http://127.0.0.1:{port}"
        rport = free_port()
        start(redis_process(rport, log_path=workdir / "redis.log"))
        wait_port(rport)
        urls = {"verify": verify_url}
        pids: dict[str, int] = {}
        variants = {
            "gateway+redis": {"REDIS_URL": f"redis://127.0.0.1:{rport}/0"},
            "gateway no-cache": {"GATEWAY_CACHE_ENABLED": "false"},
        }
        trees: dict[str, Path | None] = dict.fromkeys(variants)
        if baseline is not None:  # its own Redis database: no entry is shared
            variants["before+redis"] = {"REDIS_URL": f"redis://127.0.0.1:{rport}/1"}
            variants["before no-cache"] = variants["gateway no-cache"]
            trees.update({"before+redis": baseline, "before no-cache": baseline})
        for name, env in variants.items():
            port = free_port()
            env = {**env, "GATEWAY_VERIFY_URL": verify_url, "GATEWAY_LOG_LEVEL": "warning"}
            app = "arbiter.services.gateway.app:create_app"
            proc = uvicorn_process(name, app, port, env=env, log_path=workdir / f"{name}.log")
            tree = trees[name]
            if tree is not None:  # uvicorn puts --app-dir first on sys.path: its `arbiter`
                proc.argv += ["--app-dir", str(tree)]
            start(proc)
            assert proc.proc is not None
            pids[name] = proc.proc.pid
            urls[name] = f"http://127.0.0.1:{port}"
        yield urls, pids


def run(
    verify_url: str | None = None,
    requests: int = 300,
    seconds: float = 5.0,
    clients: int = 16,
    n_groups: int = 64,
    baseline: Path | None = None,
) -> dict[str, Any]:
    """Start Redis + two gateways (four with ``baseline``) and verify unless given; return
    every number."""
    groups = load_groups(n_groups, seed=3)
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory() as tmp,
        _stack(verify_url, Path(tmp), baseline) as (urls, pids),
    ):
        gateways = {k: v for k, v in urls.items() if k != "verify"}
        cpu0 = {k: cpu_seconds(pid) for k, pid in pids.items()}
        latency = asyncio.run(_latency(urls["verify"], gateways, groups, requests))
        # Gateway CPU per request: what it adds on an idle core, whatever the load.
        gateway_cpu_ms = {
            k: 1000 * (cpu_seconds(pid) - cpu0[k]) / (2 * (requests + 20))
            for k, pid in pids.items()
        }
        tput = {}
        for per in (1, 8):
            before = cpu_seconds(pids["gateway+redis"])
            got = asyncio.run(_throughput(urls["gateway+redis"], groups, per, clients, seconds))
            used = cpu_seconds(pids["gateway+redis"]) - before
            got["gateway_cpu_s"] = used
            tput[f"{per} group/request"] = got
    added = {}
    for gw in gateways:
        for recipe, base in (("math", "direct math"), ("gsm8k", "direct math+format")):
            key = f"{gw} {recipe}"
            added[key] = {
                "p50_ms": latency[key]["p50_ms"] - latency[base]["p50_ms"],
                "p99_ms": latency[key]["p99_ms"] - latency[base]["p99_ms"],
            }
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.platform()}",
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "latency_ms": latency,
        "added_latency_ms": added,
        "gateway_cpu_ms_per_request": gateway_cpu_ms,
        "cached_throughput": tput,
        "clients": clients,
        "baseline": str(baseline) if baseline else None,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"machine: {result['machine']}",
        f"uptime at end: {result['uptime']}",
        "",
        "(b) latency, one group of 8, sequential | p50 ms | p99 ms | added p50 | added p99",
        "--- | --- | --- | --- | ---",
    ]
    for key, v in result["latency_ms"].items():
        add = result["added_latency_ms"].get(key)
        extra = f"{add['p50_ms']:+.2f} | {add['p99_ms']:+.2f}" if add else "— | —"
        lines.append(f"{key} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | {extra}")
    lines.append("")
    for key, ms in result["gateway_cpu_ms_per_request"].items():
        lines.append(f"{key}: {ms:.2f} ms of gateway CPU per /v1/score request (miss path)")
    lines += [
        "",
        f"(c) cached hits, Redis, {result['clients']} clients | requests/s | responses/s "
        "| gateway CPU ms/request",
        "--- | --- | --- | ---",
    ]
    for key, v in result["cached_throughput"].items():
        rps, resp = v["requests_per_s"], v["responses_per_s"]
        cpu_ms = 1000 * v["gateway_cpu_s"] / max(1.0, rps * v["seconds"])
        lines.append(f"{key}, groups of 8 | {rps:.0f} | {resp:.0f} | {cpu_ms:.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verify-url", default=None, help="use a running verify service")
    parser.add_argument("--requests", type=int, default=300, help="(b) rounds")
    parser.add_argument("--seconds", type=float, default=5.0, help="(c) duration per variant")
    parser.add_argument("--clients", type=int, default=16, help="(c) concurrent clients")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    parser.add_argument("--plot", action="store_true", help="redraw the docs figure from --json")
    parser.add_argument(
        "--baseline", type=Path, default=None, help="another checkout's gateway, timed alongside"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    result = run(args.verify_url, args.requests, args.seconds, args.clients, baseline=args.baseline)
    if args.json:
        record.write_result(Path(args.json), result, indent=2)
        if args.plot:
            from bench.services import plots

            print(plots.render("gateway", Path(args.json)))
    print(table(result))


if __name__ == "__main__":
    main()
