"""The cost of teams on the gateway's hot path: auth + quota + usage (+ Idempotency-Key).

Two gateways on one verify service and one Redis, started as ``arbiter serve gateway``:
``off`` without a keys file (no auth, no quota, no ledger) and ``teams`` with one (every
request: the key's HMAC checked, one token-bucket script call before the work, one
pipelined ledger write after it). Sequential requests over one keep-alive connection per
variant, interleaved in shuffled rounds so both see the same machine and load:

- ``miss``: one group of 8 GSM8K-like responses, every text new (verify scores them all);
- ``hit``: the same group every time (every score from the Redis cache): the path where a
  fixed cost weighs most;
- ``+idem``: the ``teams`` gateway with a new ``Idempotency-Key`` per request (claim before,
  stored answer after: two more Redis round trips); ``replay``: the same key again (the
  stored answer, nothing scored).

    .venv/bin/python -m bench.services.auth [--requests 300] [--json bench/results/auth.json]

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
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from arbiter.keys import create
from arbiter.procs import free_port, redis_process, service_process
from bench import record
from bench.services.gateway import RawClient, _pct, _unique, started
from bench.services.procstat import cpu_seconds
from bench.services.verify import load_groups

log = logging.getLogger("bench.services.auth")

SECRET = "bench-secret-" + "0" * 32


@contextmanager
def _stack(workdir: Path) -> Iterator[tuple[dict[str, str], dict[str, int], str]]:
    """verify, Redis, the two gateways; yields (urls, gateway pids, the teams key)."""
    keys = workdir / "keys.yaml"
    key, _ = create(keys, "bench", secret=SECRET, limits={"responses_per_minute": 10**9})
    with ExitStack() as stack:
        start = partial(started, stack)

        vport, rport = free_port(), free_port()
        start(service_process("verify", vport, env={"VERIFY_WORKERS": "2"},
                              log_path=workdir / "verify.log", ready_path="/readyz"))  # fmt: skip
        start(redis_process(rport, log_path=workdir / "redis.log"))
        base = {
            "GATEWAY_VERIFY_URL": f"http://127.0.0.1:{vport}",
            "REDIS_URL": f"redis://127.0.0.1:{rport}/0",
            "GATEWAY_LOG_LEVEL": "warning",
        }
        variants = {
            "off": base,
            "teams": {**base, "GATEWAY_KEYS_FILE": str(keys), "GATEWAY_KEY_SECRET": SECRET},
        }
        urls: dict[str, str] = {}
        pids: dict[str, int] = {}
        for name, env in variants.items():
            port = free_port()
            proc = start(service_process("gateway", port, env=env,
                                         log_path=workdir / f"gateway-{name}.log"))  # fmt: skip
            assert proc.proc is not None
            urls[name], pids[name] = f"http://127.0.0.1:{port}", proc.proc.pid
        yield urls, pids, key


async def _rounds(
    urls: dict[str, str], key: str, groups: list[dict[str, Any]], n: int
) -> dict[str, dict[str, float]]:
    auth = {"Authorization": f"Bearer {key}"}
    clients = {"off": RawClient(urls["off"]), "teams": RawClient(urls["teams"], auth)}
    hit_body = json.dumps({"recipe": "gsm8k", "groups": [groups[0]]}).encode()
    replay_key = {"Idempotency-Key": str(uuid.uuid4())}
    times: dict[str, list[float]] = {}
    rng = random.Random(7)
    for i in range(n + 20):  # the first 20 rounds warm up (and fill the hit cache)
        steps: list[tuple[str, str, bytes, dict[str, str]]] = []
        for k, name in enumerate(clients):
            for idem in (False, True) if name == "teams" else (False,):
                nonce = (i * 4 + k) * 2 + idem
                g = _unique(groups[(i + k) % len(groups)], nonce)
                miss = json.dumps({"recipe": "gsm8k", "groups": [g]}).encode()
                extra = {"Idempotency-Key": str(uuid.uuid4())} if idem else {}
                label = name + ("+idem" if idem else "")
                steps.append((f"{label} miss", name, miss, extra))
                steps.append((f"{label} hit", name, hit_body, extra))
        steps.append(("teams replay", "teams", hit_body, replay_key))
        rng.shuffle(steps)
        for label, name, body, extra in steps:
            if label.endswith("+idem hit"):  # a new key each time: scored, not replayed
                extra = {"Idempotency-Key": str(uuid.uuid4())}
            start = time.perf_counter()
            status, _ = await clients[name].post("/v1/score", body, extra)
            times.setdefault(label, []).append((time.perf_counter() - start) * 1000)
            assert status == 200, (label, status)
        if i == 19:
            times.clear()
    for c in clients.values():
        await c.close()
    return {
        k: {"p50_ms": round(statistics.median(v), 3), "p90_ms": round(_pct(v, 0.9), 3),
            "p99_ms": round(_pct(v, 0.99), 3), "n": len(v)}
        for k, v in sorted(times.items())
    }  # fmt: skip


def run(requests: int = 300, n_groups: int = 64) -> dict[str, Any]:
    groups = load_groups(n_groups, seed=5)
    with tempfile.TemporaryDirectory() as tmp, _stack(Path(tmp)) as (urls, pids, key):
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}  # warm-up rounds included
        latency = asyncio.run(_rounds(urls, key, groups, requests))
        cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
    p50 = {k: v["p50_ms"] for k, v in latency.items()}
    return {
        "bench": "auth",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg": os.getloadavg(),
        },
        "requests_per_variant": requests,
        "latency_ms": latency,
        "added_p50_ms": {
            "miss": round(p50["teams miss"] - p50["off miss"], 3),
            "hit": round(p50["teams hit"] - p50["off hit"], 3),
            "miss+idem": round(p50["teams+idem miss"] - p50["off miss"], 3),
            "hit+idem": round(p50["teams+idem hit"] - p50["off hit"], 3),
        },
        "gateway_cpu_s": {k: round(v, 2) for k, v in cpu.items()},
        # off served 2 variants (miss, hit); teams 5 (miss, hit, +idem miss, +idem hit, replay)
        "gateway_cpu_ms_per_request": {
            "off": round(cpu["off"] / (2 * requests) * 1000, 3),
            "teams": round(cpu["teams"] / (5 * requests) * 1000, 3),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300, help="timed requests per variant")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = run(args.requests)
    print(json.dumps(out, indent=2))
    if args.json:
        record.write_result(args.json, out, indent=2)


if __name__ == "__main__":
    main()
