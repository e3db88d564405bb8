"""Soak: a bounded load on a loopback stack, a hostile client mixed in, faults on demand.

Starts Redis, verify, embedding and the gateway (``arbiter serve``, free ports), then for
``--seconds``:

- ``--clients`` well-behaved clients send ``/v1/score`` (4 groups x 8 responses, recipe
  math_accuracy + format + diversity) with known answers; a tenth of their groups repeat
  an earlier one (cache hits). Every score is checked: right, or null with its error
  entry and the response masked. A wrong or unexplained score is counted, never hidden.
- one hostile client cycles through: a body announced at 50 MB, a lone surrogate, 10,000-
  deep JSON, a wrong content type, 24 slow math items, a slow request it abandons after
  1 s, a 128 x 256 request. It must only ever get 4xx or 200.
- ``--faults``: verify, then the embedding service, then Redis are killed (SIGKILL) and
  restarted 3 s later; the recovery time is the time from the restart until a group never
  sent before gets a non-null score of that component through the gateway (Redis: until
  the gateway's cache check reads ok again).

Every second: throughput, p50/p99 latency and error rate of the well-behaved clients,
RSS of every process (children included) and the load average. At the end every group
the cache may hold is scored again (the last 256 sent since Redis last started empty): the
cache must hold no wrong value.

    .venv/bin/python -m bench.services.soak [--seconds 60] [--clients 8] [--faults] [--no-hostile]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from arbiter.procs import ManagedProcess, free_port, redis_process, service_process
from bench.record import write_result
from bench.services.soak_hostile import hostile
from bench.services.soak_stack import run_on_stack

RECIPE = {"components": [
    {"name": "math_accuracy", "weight": 1.0}, {"name": "format", "weight": 0.5},
    {"name": "diversity", "weight": 0.1},
]}  # fmt: skip
WEIGHTS = {"math_accuracy": 1.0, "format": 0.5, "diversity": 0.1}  # as in RECIPE


@dataclass
class Stats:
    start: float = field(default_factory=time.monotonic)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (t, seconds)
    statuses: dict[str, int] = field(default_factory=dict)
    errors: list[float] = field(default_factory=list)  # t of non-200 answers
    scores: int = 0
    nulls: dict[str, int] = field(default_factory=dict)  # by error kind
    wrong: list[str] = field(default_factory=list)
    hostile: dict[str, int] = field(default_factory=dict)
    groups: list[dict[str, Any]] = field(default_factory=list)  # sent, for the cache check
    sent: int = 0  # groups added to ``groups`` so far
    cache_from: int = 0  # ``sent`` when Redis, the cache, was last killed (emptied)

    def t(self) -> float:
        return time.monotonic() - self.start


def make_group(rng: random.Random) -> dict[str, Any]:
    gold = rng.randint(1, 10**6)
    nonce = rng.getrandbits(48)
    responses = [
        f"<think>step {nonce} {j} {'x' * rng.randint(0, 200)}</think>"
        f"<answer>{gold if j % 2 == 0 else gold + 1}</answer>"
        for j in range(8)
    ]
    return {"id": f"g{nonce}", "prompt": f"q {nonce}", "reference": str(gold),
            "responses": responses}  # fmt: skip


def check_group(sent: dict[str, Any], got: dict[str, Any], stats: Stats) -> None:
    """Right, or null + error + masked; the reward is the weighted sum or null."""
    errors = {(e["component"], e["index"]) for e in got["errors"]}
    for name, scores in got["components"].items():
        for j, s in enumerate(scores):
            stats.scores += 1
            if s is None:
                kinds = [e["kind"] for e in got["errors"] if e["component"] == name
                         and e["index"] == j]  # fmt: skip
                stats.nulls[kinds[0] if kinds else "unexplained"] = (
                    stats.nulls.get(kinds[0] if kinds else "unexplained", 0) + 1
                )
                if (name, j) not in errors or not got["masked"][j]:
                    stats.wrong.append(f"{sent['id']}/{name}/{j}: null without error or mask")
                continue
            want = {"math_accuracy": 1.0 if j % 2 == 0 else 0.0, "format": 1.0}.get(name)
            if want is not None and s != want:
                stats.wrong.append(f"{sent['id']}/{name}/{j}: {s} != {want}")
            if name == "diversity" and not 0.0 <= s <= 2.0:
                stats.wrong.append(f"{sent['id']}/{name}/{j}: {s} out of [0, 2]")
    for j, reward in enumerate(got["rewards"]):
        parts = [got["components"][n][j] for n in WEIGHTS]
        if None in parts:
            if reward is not None:
                stats.wrong.append(f"{sent['id']}/reward/{j}: {reward} with a null part")
            continue
        want = sum(w * p for w, p in zip(WEIGHTS.values(), parts, strict=True))
        if reward is None or abs(reward - want) > 1e-9:
            stats.wrong.append(f"{sent['id']}/reward/{j}: {reward} != {want}")


async def client(url: str, seed: int, stop: asyncio.Event, stats: Stats) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=120) as http:
        while not stop.is_set():
            groups = []
            for _ in range(4):
                if stats.groups and rng.random() < 0.1:
                    groups.append(rng.choice(stats.groups))
                else:
                    groups.append(make_group(rng))
            start = time.perf_counter()
            try:
                r = await http.post(f"{url}/v1/score", json={"recipe": RECIPE, "groups": groups})
            except httpx.HTTPError as exc:
                key = type(exc).__name__
                stats.statuses[key] = stats.statuses.get(key, 0) + 1
                stats.errors.append(stats.t())
                continue
            t = stats.t()
            stats.latencies.append((t, time.perf_counter() - start))
            stats.statuses[str(r.status_code)] = stats.statuses.get(str(r.status_code), 0) + 1
            if r.status_code != 200:
                stats.errors.append(t)
                continue
            for sent, got in zip(groups, r.json()["groups"], strict=True):
                check_group(sent, got, stats)
            before = len(stats.groups)
            stats.groups.extend(g for g in groups if g not in stats.groups[-64:])
            stats.sent += len(stats.groups) - before
            del stats.groups[:-2000]


def rss_mb(proc: ManagedProcess) -> float:
    if proc.proc is None or proc.proc.poll() is not None:
        return 0.0
    try:
        p = psutil.Process(proc.proc.pid)
        return sum(x.memory_info().rss for x in [p, *p.children(recursive=True)]) / 2**20
    except psutil.Error:
        return 0.0


async def sample(procs: list[ManagedProcess], stop: asyncio.Event, stats: Stats,
                 timeline: list[dict[str, Any]]) -> None:  # fmt: skip
    seen = 0
    while not stop.is_set():
        await asyncio.sleep(1.0)
        window = [d for _, d in stats.latencies[seen:]]
        seen = len(stats.latencies)
        timeline.append({
            "t": round(stats.t(), 1), "requests": len(window),
            "p50_ms": round(statistics.median(window) * 1000, 1) if window else None,
            "p99_ms": round(_p99(window) * 1000, 1) if window else None,
            "errors": sum(1 for t in stats.errors if stats.t() - 1.0 <= t),
            "rss_mb": {p.name: round(rss_mb(p), 1) for p in procs},
            "load1": round(os.getloadavg()[0], 2),
        })  # fmt: skip


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def faults(procs: dict[str, ManagedProcess], gateway: str, seconds: float,
                 stats: Stats, out: list[dict[str, Any]]) -> None:  # fmt: skip
    for name, at in (("verify", 0.15), ("embedding", 0.35), ("redis", 0.65)):
        await asyncio.sleep(max(0.0, at * seconds - stats.t()))
        proc = procs[name]
        assert proc.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.proc.pid, signal.SIGKILL)
        killed = stats.t()
        if name == "redis":  # the answers cached so far are gone with it
            stats.cache_from = stats.sent
        await asyncio.sleep(3.0)
        proc.start()
        restarted = stats.t()
        component = {"verify": "math_accuracy", "embedding": "diversity"}.get(name)
        recovered = None
        deadline = restarted + 90
        rng = random.Random(name)
        async with httpx.AsyncClient(timeout=10) as http:
            while stats.t() < deadline and recovered is None:
                await asyncio.sleep(0.2)
                with contextlib.suppress(httpx.HTTPError, KeyError):
                    if component is None:  # Redis: the gateway's cache check reads ok again
                        r = await http.get(f"{gateway}/readyz")
                        ok = r.json()["checks"].get("cache") == "ok"
                    else:  # a group never sent before, so the answer cannot be cached
                        recipe = {"components": [{"name": component}]}
                        r = await http.post(f"{gateway}/v1/score", json={
                            "recipe": recipe, "groups": [make_group(rng)]})  # fmt: skip
                        ok = None not in r.json()["groups"][0]["components"][component]
                    if ok:
                        recovered = stats.t()
        took = None if recovered is None else round(recovered - restarted, 2)
        out.append({"service": name, "killed_at_s": round(killed, 1),
                    "restarted_at_s": round(restarted, 1), "recovery_s": took})  # fmt: skip


async def recheck(url: str, stats: Stats) -> int:
    """Score again every group the cache may hold (the last 256 sent since Redis was last
    killed): now cache hits, which must be right. The groups sent before are not in the
    cache any more, and scoring them afresh (37 s of a 35 s CI soak) checks nothing more."""
    before = len(stats.wrong)
    async with httpx.AsyncClient(timeout=120) as http:
        n = min(256, stats.sent - stats.cache_from)
        groups = stats.groups[len(stats.groups) - n :]
        for i in range(0, len(groups), 64):
            chunk = groups[i : i + 64]
            r = await http.post(f"{url}/v1/score", json={"recipe": RECIPE, "groups": chunk})
            r.raise_for_status()
            for sent, got in zip(chunk, r.json()["groups"], strict=True):
                check_group(sent, got, stats)
    return len(stats.wrong) - before


def stack(workdir: Path) -> dict[str, ManagedProcess]:
    rport, vport, eport, gport = (free_port() for _ in range(4))
    procs = {
        "redis": redis_process(rport, log_path=workdir / "redis.log"),
        "verify": service_process("verify", vport, {"VERIFY_WORKERS": "2"},
                                  workdir / "verify.log", "/readyz"),
        "embedding": service_process("embedding", eport, {"EMBEDDING_DEVICE": "cpu"},
                                     workdir / "embedding.log", "/readyz"),
        "gateway": service_process("gateway", gport, {
            "GATEWAY_VERIFY_URL": f"http://127.0.0.1:{vport}",
            "GATEWAY_EMBEDDING_URL": f"http://127.0.0.1:{eport}",
            "REDIS_URL": f"redis://127.0.0.1:{rport}/0"}, workdir / "gateway.log"),
    }  # fmt: skip
    return procs


async def soak(url: str, procs: dict[str, ManagedProcess], seconds: float, clients: int,
               with_faults: bool, with_hostile: bool = True) -> dict[str, Any]:  # fmt: skip
    stats, stop = Stats(), asyncio.Event()
    timeline: list[dict[str, Any]] = []
    fault_log: list[dict[str, Any]] = []
    tasks = [asyncio.create_task(client(url, seed, stop, stats)) for seed in range(clients)]
    if with_hostile:
        tasks.append(asyncio.create_task(hostile(url, stop, stats.hostile)))
    tasks.append(asyncio.create_task(sample(list(procs.values()), stop, stats, timeline)))
    if with_faults:
        fault_task = asyncio.create_task(faults(procs, url, seconds, stats, fault_log))
    await asyncio.sleep(seconds)
    if with_faults:
        await fault_task  # the last restart's recovery
    stop.set()
    await asyncio.gather(*tasks)
    wrong_after = await recheck(url, stats)
    lat = [d for _, d in stats.latencies]
    requests = len(lat) + len(stats.errors)
    return {
        "seconds": round(stats.t(), 1), "clients": clients,
        "requests": requests, "requests_per_s": round(len(lat) / seconds, 1),
        "p50_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
        "p99_ms": round(_p99(lat) * 1000, 1) if lat else None,
        "error_rate": round(len(stats.errors) / max(1, requests), 4),
        "statuses": stats.statuses, "scores": stats.scores, "nulls_by_kind": stats.nulls,
        "wrong": len(stats.wrong), "wrong_examples": stats.wrong[:10],
        "wrong_in_cache_recheck": wrong_after,
        "rechecked": min(256, stats.sent - stats.cache_from), "hostile": stats.hostile,
        "faults": fault_log, "timeline": timeline,
        "max_rss_mb": {name: max(s["rss_mb"][name] for s in timeline) for name in procs}
        if timeline else {},
        "hostile_client": with_hostile,
        "cpus": os.cpu_count(), "load_avg_end": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


def run(
    seconds: float = 60, clients: int = 8, with_faults: bool = False, with_hostile: bool = True
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="arbiter-soak-") as tmp:
        procs = stack(Path(tmp))
        return run_on_stack(
            procs, lambda url: soak(url, procs, seconds, clients, with_faults, with_hostile)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--no-hostile", action="store_true", help="well-behaved clients only")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", action="store_true", help="redraw the docs figure from --json")
    args = parser.parse_args()
    out = run(args.seconds, args.clients, args.faults, not args.no_hostile)
    summary = {k: v for k, v in out.items() if k != "timeline"}
    print(json.dumps(summary, indent=2))
    for s in out["timeline"]:
        rss = " ".join(f"{k}={v:.0f}" for k, v in s["rss_mb"].items())
        print(f"t={s['t']:>5} req={s['requests']:>4} p50={s['p50_ms']} p99={s['p99_ms']} "
              f"err={s['errors']} load={s['load1']} rss_mb: {rss}")  # fmt: skip
    if args.json:
        write_result(args.json, out)
        if args.plot:
            from bench.services import plots

            print(plots.render("soak", args.json))


if __name__ == "__main__":
    main()
