"""Sharing at the edges: four cases a shared deployment meets, each with the bound it must
hold, on one stack started as an operator starts it (``arbiter up --keys``, both Redis,
verify with 2 workers, embedding on the CPU, the gateway's Redis pool cut to 8), one after
the other, each by teams of its own:

- **veteran/newcomer**: a team with a long verify history (it scored ``history`` ordinary
  responses and ``history_slow`` that run to verify's deadline) sends one correct
  one-response request while a newcomer has 15 requests of 8 slow LaTeX answers queued. Bound:
  answered with its reward (1.5) within one item's deadline (``VERIFY_DEADLINE_S``, 5 s).
  A team without history then sends the same: its wait is recorded beside, not bounded.
- **bulk embedder**: a team's 30 requests of 64 long texts (~220 words) queued at the
  embedder; a newcomer's ``gsm8k-diverse`` request of 8 short responses. Bound: diversity on
  all 8, not null, within 10 s.
- **flood while Redis stalls** (``soak_flood``): a 120/min team floods with one-sample
  OpenRLHF requests, both Redis stopped (SIGSTOP) for 8 s in the middle, clients of another
  team leaving mid-body and mid-scoring. Bounds: answered at most the quota + 10 %; the
  ledger equal to the answered requests once Redis is back; no 5xx added by the leavers.
- **storage filler**: a team stores idempotent answers (cache hits, a new
  ``Idempotency-Key`` each) as fast as it can. Bounds: no key of another team's state
  (ledgers, quotas, stored answers) lost or changed, nothing evicted from the state Redis,
  and the team held at its ``GATEWAY_IDEMPOTENCY_TEAM_BYTES`` (reached, never passed).

    .venv/bin/python -m bench.services.soak_teams --edges [--short] [--port-base N] [--json F]

A bound missed prints a line starting ``MISSED`` and exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from arbiter.keys import create
from bench.services.soak_flood import checks as flood_checks
from bench.services.soak_flood import flood, request_counts
from bench.services.soak_up import Up, arbiter_up

SECRET = "soak-secret-" + "s" * 40
DEADLINE_S = 5.0  # verify's deadline per item, set on the stack: the veteran's bound
DIVERSITY_BOUND_S = 10.0
WORDS = (
    "apples", "cost", "each", "store", "bought", "more", "than", "twice", "many", "left", "after",
    "gave", "friend", "total", "price", "sold", "hours", "minutes", "week", "garden", "rows",
)  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    history: int  # the veteran's ordinary responses scored first
    history_slow: int  # ... and its responses that run to the deadline
    newcomer: tuple[int, int] = (15, 8)  # requests x slow responses
    bulk: tuple[int, int] = (30, 64)  # requests x long texts
    flood_clients: int = 400
    flood_s: float = 40.0
    stall_s: float = 8.0
    filler_s: float = 30.0
    filler_budget: int = 2 * 2**20  # reached in ~16 s at the 0.13 MB/s stored here at load 12


FULL = Sizes(history=4096, history_slow=16)
# CI: the same bounds; a shorter history (4 slow items: 20 worker-seconds of charge, still
# two item deadlines ahead of a newcomer on 2 workers), half the flood for 16 s (the same 8 s
# stall), a smaller byte budget.
SHORT = Sizes(history=128, history_slow=4, flood_clients=200, flood_s=16.0, filler_s=6.0,
              filler_budget=256 * 1024)  # fmt: skip


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _slow(k: int) -> str:
    return f"\\boxed{{7^{{{123456789 + k}}}}}"  # math-verify runs it to the deadline


def _group(rng: random.Random, n: int) -> dict[str, Any]:
    a, b, nonce = rng.randint(1, 10**6), rng.randint(1, 10**6), rng.getrandbits(48)
    responses = [f"<think>{nonce} {j}</think><answer>{a + b + j % 2}</answer>" for j in range(n)]
    return {"prompt": f"{nonce}: {a} + {b}", "reference": str(a + b), "responses": responses}


async def veteran_newcomer(url: str, keys: dict[str, str], sizes: Sizes) -> dict[str, Any]:
    rng = random.Random(31)
    vet = httpx.AsyncClient(base_url=url, headers=_auth(keys["veteran"]), timeout=120)
    new = httpx.AsyncClient(base_url=url, headers=_auth(keys["newcomer"]), timeout=120)
    start = time.perf_counter()
    for _ in range(sizes.history // 64):  # history: requests of 8 groups of 8
        body = {"recipe": "gsm8k", "groups": [_group(rng, 8) for _ in range(8)]}
        (await vet.post("/v1/score", json=body)).raise_for_status()
    for first in range(1, sizes.history_slow + 1, 4):  # 4 at a time: 10 s on 2 workers, well
        slow = [_slow(-k) for k in range(first, min(first + 4, sizes.history_slow + 1))]
        body = {"recipe": "gsm8k", "groups": [{"reference": "1", "responses": slow}]}
        (await vet.post("/v1/score", json=body)).raise_for_status()  # inside the 30 s deadline
    history_s = time.perf_counter() - start
    requests, per = sizes.newcomer
    flood = [
        asyncio.create_task(new.post("/v1/score", json={"recipe": "gsm8k", "groups": [
            {"reference": "1", "responses": [_slow(i * per + j) for j in range(per)]}]}))
        for i in range(requests)
    ]  # fmt: skip
    await asyncio.sleep(1.0)  # the newcomer's items are queued at verify
    behind = sum(not t.done() for t in flood)  # the load is there: else the case proves nothing
    # For comparison, not a bound: a team without history sends the same at the same moment.
    victim = httpx.AsyncClient(base_url=url, headers=_auth(keys["victim"]), timeout=120)

    async def timed(http: httpx.AsyncClient) -> tuple[httpx.Response, float]:
        start = time.perf_counter()
        r = await http.post("/v1/score", json={"recipe": "gsm8k", "groups": [_group(rng, 1)]})
        return r, time.perf_counter() - start

    (r, waited), (v, victim_waited) = await asyncio.gather(timed(vet), timed(victim))
    reward = r.json()["groups"][0]["rewards"][0] if r.status_code == 200 else None
    errors = r.json()["groups"][0]["errors"] if r.status_code == 200 else r.json()
    victim_reward = v.json()["groups"][0]["rewards"][0] if v.status_code == 200 else None
    for task in flood:  # the newcomer leaves: its queued items are dropped
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    await asyncio.gather(vet.aclose(), new.aclose(), victim.aclose())
    await asyncio.sleep(DEADLINE_S)  # its running items end at their deadline
    return {"history_responses": sizes.history, "history_slow": sizes.history_slow,
            "history_s": round(history_s, 1), "newcomer": f"{requests} x {per} slow",
            "newcomer_pending_at_send": behind,
            "status": r.status_code, "reward": reward, "errors": errors,
            "waited_s": round(waited, 2), "bound_s": DEADLINE_S,
            "no_history_waited_s": round(victim_waited, 2),
            "no_history_reward": victim_reward}  # fmt: skip


def _long(rng: random.Random, nonce: int, j: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(220))
    return f"<think>{nonce} {j} {words}</think><answer>{j}</answer>"


async def bulk_embedder(url: str, keys: dict[str, str], sizes: Sizes) -> dict[str, Any]:
    rng = random.Random(32)
    bulk = httpx.AsyncClient(base_url=url, headers=_auth(keys["bulk"]), timeout=120)
    requests, texts = sizes.bulk
    queued = [
        asyncio.create_task(bulk.post("/v1/score", json={"recipe": "gsm8k-diverse", "groups": [
            {"reference": "1", "responses": [_long(rng, i, j) for j in range(texts)]}]}))
        for i in range(requests)
    ]  # fmt: skip
    await asyncio.sleep(2.0)  # the bulk texts are at the embedder
    behind = sum(not t.done() for t in queued)
    nonce = rng.getrandbits(48)
    group = {"reference": "7", "responses": [
        f"<think>{nonce}: {j} apples and {j + 3} pears</think><answer>{7 + j % 2}</answer>"
        for j in range(8)]}  # fmt: skip
    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, headers=_auth(keys["fresh"]), timeout=120) as h:
        r = await h.post("/v1/score", json={"recipe": "gsm8k-diverse", "groups": [group]})
    waited = time.perf_counter() - start
    diversity = r.json()["groups"][0]["components"]["diversity"] if r.status_code == 200 else []
    pending = sum(not t.done() for t in queued)
    for task in queued:
        task.cancel()
    await asyncio.gather(*queued, return_exceptions=True)
    await bulk.aclose()
    return {"bulk": f"{requests} x {texts} long texts", "bulk_pending_at_send": behind,
            "bulk_pending_at_answer": pending,
            "status": r.status_code, "diversity": diversity, "waited_s": round(waited, 2),
            "bound_s": DIVERSITY_BOUND_S}  # fmt: skip


def _snapshot(state: Any, skip: str) -> dict[str, tuple[str, Any, int]]:
    """Every key of the state Redis not of team ``skip``: its type, value, TTL in ms."""
    out = {}
    for key in state.scan_iter(count=1000):
        if f":{skip}:" in key or key.endswith(f":{skip}"):
            continue
        kind = state.type(key)
        value = {"hash": state.hgetall, "string": state.get}.get(kind, lambda k: None)(key)
        out[key] = (kind, value, state.pttl(key))
    return out


async def storage_filler(up: Up, keys: dict[str, str], sizes: Sizes) -> dict[str, Any]:
    url, state = up.url, up.state_redis()
    # Another team's stored answer: it must survive the filler as the ledgers and quotas do.
    async with httpx.AsyncClient(base_url=url, headers=_auth(keys["veteran"]), timeout=60) as h:
        kept = {"recipe": "gsm8k", "groups": [_group(random.Random(5), 8)]}
        r = await h.post("/v1/score", json=kept, headers={"Idempotency-Key": "kept-1"})
        r.raise_for_status()
    await asyncio.sleep(2.0)  # the ledger's buffer is written
    before = await asyncio.to_thread(_snapshot, state, "filler")
    evicted0 = int(state.info("stats")["evicted_keys"])
    dropped0 = (await request_counts(url, keys["ops"]))["idempotency_dropped"]
    body = {"recipe": "gsm8k", "groups": [_group(random.Random(6), 64) for _ in range(8)]}
    async with httpx.AsyncClient(base_url=url, headers=_auth(keys["filler"]), timeout=60) as h:
        (await h.post("/v1/score", json=body)).raise_for_status()  # then: cache hits only
    sizes_seen: list[int] = []
    stop = time.monotonic() + sizes.filler_s

    async def fill() -> None:
        async with httpx.AsyncClient(base_url=url, headers=_auth(keys["filler"]),
                                     timeout=60) as http:  # fmt: skip
            while time.monotonic() < stop:
                r = await http.post("/v1/score", json=body,
                                    headers={"Idempotency-Key": uuid.uuid4().hex})  # fmt: skip
                if r.status_code == 200:
                    sizes_seen.append(len(r.content))

    start = time.monotonic()
    await asyncio.gather(*(fill() for _ in range(8)))
    elapsed = time.monotonic() - start
    held = int(state.hget("arb:idem-bytes:v1:filler", "total") or 0)
    after = await asyncio.to_thread(_snapshot, state, "filler")
    lost = [k for k, (_, _, ttl) in before.items()
            if k not in after and (ttl < 0 or ttl > (elapsed + 10) * 1000)]  # fmt: skip
    # A stored answer must be as it was; a ledger's counters may grow (another team's late
    # request settling), never shrink.
    changed = [k for k, (_, value, _) in before.items() if k in after and (
        (k.startswith("arb:idem:v1:") and after[k][1] != value)
        or (k.startswith("arb:usage:v2:team:")
            and any(int(after[k][1].get(f, 0)) < int(n) for f, n in value.items())))]  # fmt: skip
    dropped = (await request_counts(url, keys["ops"]))["idempotency_dropped"] - dropped0
    memory = state.info("memory")
    return {"seconds": round(elapsed, 1), "answers_stored": len(sizes_seen),
            "answer_bytes": max(sizes_seen, default=0),
            "stored_mb_per_s": round(sum(sizes_seen) / 2**20 / elapsed, 2),
            "budget_bytes": sizes.filler_budget, "held_bytes": held, "dropped": dropped,
            "others_keys": len(before), "others_lost": lost[:10], "others_changed": changed[:10],
            "evicted": int(state.info("stats")["evicted_keys"]) - evicted0,
            "state_used_mb": round(memory["used_memory"] / 2**20, 1),
            "state_maxmemory_mb": round(memory["maxmemory"] / 2**20, 1)}  # fmt: skip


def bounds(out: dict[str, Any]) -> list[tuple[bool, str]]:
    """(held, line) for every bound of every case; a case that raised misses its bounds."""
    failed = [(False, f"{name}: raised {case['error']}") for name, case in out.items()
              if isinstance(case, dict) and "error" in case]  # fmt: skip
    if failed:
        return failed
    v, b, f = out["veteran_newcomer"], out["bulk_embedder"], out["storage_filler"]
    div = b["diversity"]
    return [
        (v["reward"] == 1.5 and v["waited_s"] <= v["bound_s"] and v["newcomer_pending_at_send"],
         f"veteran: reward {v['reward']} (want 1.5) after {v['waited_s']} s behind "
         f"{v['newcomer']} ({v['newcomer_pending_at_send']} pending); bound one item's "
         f"deadline, {v['bound_s']} s (no history: {v['no_history_waited_s']} s)"),
        (len(div) == 8 and None not in div and b["waited_s"] <= b["bound_s"]
         and b["bulk_pending_at_send"],
         f"bulk embedder: diversity {div} after {b['waited_s']} s behind {b['bulk']} "
         f"({b['bulk_pending_at_send']} pending); bound 8 not null within {b['bound_s']} s"),
        *flood_checks(out["flood"]),
        (not f["others_lost"] and not f["others_changed"] and f["evicted"] == 0,
         f"storage filler: of {f['others_keys']} keys of other teams' state, lost "
         f"{f['others_lost']}, changed {f['others_changed']}; evicted {f['evicted']}; bound none"),
        (f["budget_bytes"] - 2 * f["answer_bytes"] <= f["held_bytes"] <= f["budget_bytes"]
         and f["dropped"] > 0,
         f"storage filler: holds {f['held_bytes']} bytes of a {f['budget_bytes']} budget "
         f"({f['dropped']:.0f} oldest dropped, {f['stored_mb_per_s']} MB/s stored); "
         "bound: reached, never passed"),
    ]  # fmt: skip


def _machine() -> dict[str, Any]:
    """What the run header (``bench.record``) leaves out: how busy the shared machine was."""
    return {"cpus": os.cpu_count(), "load_avg_end": [round(x, 2) for x in os.getloadavg()]}


async def _cases(up: Up, keys: dict[str, str], sizes: Sizes) -> dict[str, Any]:
    """Each case in turn; one that raises is recorded with its error (its bounds missed)."""
    out: dict[str, Any] = {"sizes": asdict(sizes)}
    cases = {
        "veteran_newcomer": lambda: veteran_newcomer(up.url, keys, sizes),
        "bulk_embedder": lambda: bulk_embedder(up.url, keys, sizes),
        "flood": lambda: flood(up, keys, sizes.flood_clients, sizes.flood_s, sizes.stall_s),
        "storage_filler": lambda: storage_filler(up, keys, sizes),
    }
    for name, case in cases.items():
        try:
            out[name] = await case()
        except Exception as exc:  # recorded: the case misses its bounds
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{name}: {out[name]}", flush=True)
    return out


def run_edges(sizes: Sizes, port_base: int | None = None,
              logs: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """The four cases on a fresh ``arbiter up --keys``; ``bounds`` of its result says which held."""
    with tempfile.TemporaryDirectory(prefix="arbiter-soak-edges-") as scratch:
        where = Path(logs or scratch)
        where.mkdir(parents=True, exist_ok=True)
        path = where / "keys.yaml"
        limits: dict[str, dict[str, object] | None] = {
            "veteran": None, "newcomer": None, "victim": None, "bulk": None, "fresh": None,
            "flooder": {"responses_per_minute": 120}, "leaver": None, "filler": None}  # fmt: skip
        keys = {n: create(path, n, secret=SECRET, limits=lim)[0] for n, lim in limits.items()}
        keys["ops"] = create(path, "ops", secret=SECRET, admin=True)[0]
        env = {"GATEWAY_KEY_SECRET": SECRET, "GATEWAY_ENVIRONMENT": "production",
               "GATEWAY_REDIS_MAX_CONNECTIONS": "8", "VERIFY_WORKERS": "2",
               "VERIFY_DEADLINE_S": str(DEADLINE_S), "EMBEDDING_DEVICE": "cpu",
               "GATEWAY_IDEMPOTENCY_TEAM_BYTES": str(sizes.filler_budget)}  # fmt: skip
        started = time.monotonic()
        with arbiter_up(path, where / "stack", env, port_base) as up:
            ready_s = time.monotonic() - started
            out = asyncio.run(_cases(up, keys, sizes))
        out["stack_ready_s"] = round(ready_s, 1)
        out["stack_env"] = {k: v for k, v in env.items() if k != "GATEWAY_KEY_SECRET"}
        out.update(_machine())
        return out


def report(out: dict[str, Any]) -> int:
    """Print each bound's line (``ok`` or ``MISSED``); 1 when any was missed."""
    missed = 0
    for held, line in bounds(out):
        print(("ok      " if held else "MISSED  ") + line)
        missed += not held
    with contextlib.suppress(KeyError):
        print(f"stack ready in {out['stack_ready_s']} s; load average at the end "
              f"{out['load_avg_end']} on {out['cpus']} cores")  # fmt: skip
    return 1 if missed else 0
