"""``arbiter up``: Redis and every service as local processes, offline defaults.

Starts redis-server (bound to 127.0.0.1), verify, embedding (unless ``--no-embedding``),
judge (when a judge server is given), sandbox (unless ``--no-sandbox``), envs (the
environments, served by the gateway at ``/ors`` and ``/nemo-gym/envs``) and the gateway;
waits until each is ready; scores a few GSM8K samples through the gateway and prints them
with the recipes the gateway can serve; then keeps the stack running until Ctrl-C or
SIGTERM, and stops every child process on the way out.

The sandbox (recipes ``code`` and ``code-all``) needs bubblewrap and a kernel that lets an
unprivileged user make user namespaces. Where bwrap is missing, or the sandbox does not
start, ``arbiter up`` says so in one line and runs without it: the gateway then has no
GATEWAY_SANDBOX_URL and refuses the code recipes (422 component_not_configured), and the
envs service offers no ``python`` or ``code`` environment.

While it runs, a child that exits is restarted with back-off and logged
(``arbiter.supervise.Supervisor``); its children never outlive it, even when it is killed
with SIGKILL (PDEATHSIG and a watchdog process, ``arbiter.supervise``). Two Redis run, as
in compose and k8s: the cache (``REDIS_URL``), bounded at ``--maxmemory 1gb``
(``ARBITER_REDIS_MAXMEMORY``) with ``allkeys-lru``, and the state Redis
(``GATEWAY_STATE_REDIS_URL``: usage ledger, quotas, idempotency keys), ``noeviction`` at
``ARBITER_STATE_REDIS_MAXMEMORY`` (1gb), so no amount of cache pressure evicts a team's
state. Both persist as in compose, an append-only file fsynced every second
(``--appendonly yes --appendfsync everysec``) in ``<logs>/redis`` and
``<logs>/state-redis``, so the state survives a restart of Redis or of ``arbiter up``.

Ports: each service's own setting (gateway 8000, verify 8001, embedding 8002, judge 8003,
sandbox 8004, envs 8005), Redis 6379 and the state Redis 6380; ``--port-base N`` (or
``ARBITER_PORT_BASE=N``) moves them all together, in that order from N, Redis at N+6, the
state Redis at N+7, so a second stack or a machine where 8000 or 6379 is taken needs one
setting. A single port flag still wins. The banner prints the
``export ARBITER_URL=...`` line that points clients, the CLI and the trainer at this stack.

Without ``--keys FILE`` the gateway runs without auth (every caller is team
``anonymous``); with it, the gateway reads that keys file (``arbiter keys``) and
``GATEWAY_KEY_SECRET`` from the environment, and the banner says which.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import httpx

from arbiter import gsm8k
from arbiter.procs import (
    ManagedProcess,
    free_port,
    redis_process,
    service_process,
    state_redis_process,
)
from arbiter.serve import SERVICES
from arbiter.services.sandbox.memory import SERVICE_MB
from arbiter.supervise import Supervisor, Watchdog

log = logging.getLogger("arbiter.up")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


PORT_BASE_ENV = "ARBITER_PORT_BASE"
# each process's offset from --port-base: the services in their default ports' order, then Redis
PORT_OFFSETS = {
    "gateway": 0, "verify": 1, "embedding": 2, "judge": 3, "sandbox": 4, "envs": 5, "redis": 6,
    "state_redis": 7,
}  # fmt: skip
REDIS_PORTS = {"redis": 6379, "state_redis": 6380}


def resolve_ports(args: argparse.Namespace) -> None:
    """Fill ``args.<name>_port`` from ``--port-base`` (or ``$ARBITER_PORT_BASE``) where no
    flag set it; Redis defaults to 6379, the services to their own settings (None here)."""
    base = getattr(args, "port_base", None)
    if base is None and os.environ.get(PORT_BASE_ENV):
        raw = os.environ[PORT_BASE_ENV]
        if not raw.isdigit():
            raise SystemExit(f"{PORT_BASE_ENV}={raw!r}: expected a port number, e.g. 28000")
        base = int(raw)
    if base is not None and not 1 <= base <= 65535 - max(PORT_OFFSETS.values()):
        raise SystemExit(f"--port-base {base}: expected 1..{65535 - max(PORT_OFFSETS.values())}")
    for name, offset in PORT_OFFSETS.items():
        if getattr(args, f"{name}_port", None) is None:
            default = REDIS_PORTS.get(name)
            setattr(args, f"{name}_port", base + offset if base is not None else default)


def sandbox_off(args: argparse.Namespace) -> str | None:
    """Why the sandbox is not started (None: it is): --no-sandbox, or no bwrap to run."""
    if getattr(args, "no_sandbox", False):
        return "--no-sandbox"
    bwrap = os.environ.get("SANDBOX_BWRAP") or "bwrap"
    if shutil.which(bwrap) is None:
        return f"{bwrap} not found; Debian: apt-get install bubblewrap"
    return None


def sandbox_rlimits() -> dict[int, tuple[int, int]]:
    """The sandbox service's own process within ``SERVICE_MB`` of address space (a soft
    limit: its sandboxes set their own, ``services/sandbox/memory.py``). With each sandbox
    within its limit, the service holds at most SERVICE_MB + workers x the larger sandbox
    limit."""
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    soft = SERVICE_MB << 20
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    return {resource.RLIMIT_AS: (soft, hard)}


def _plan(args: argparse.Namespace, logs: Path) -> list[ManagedProcess]:
    """The processes to start, in order (each depends only on those before it)."""
    # The cache (LRU) and the state (noeviction); both survive a restart: AOF, fsync every s.
    redis = redis_process(args.redis_port, log_path=logs / "redis.log", data_dir=logs / "redis")
    state_port = getattr(args, "state_redis_port", None) or free_port()
    state = state_redis_process(
        state_port, log_path=logs / "state-redis.log", data_dir=logs / "state-redis"
    )
    procs = [redis, state]
    env: dict[str, dict[str, str]] = {name: {} for name in SERVICES}
    env["gateway"]["REDIS_URL"] = f"redis://127.0.0.1:{args.redis_port}/0"
    env["gateway"]["GATEWAY_STATE_REDIS_URL"] = f"redis://127.0.0.1:{state_port}/0"
    env["envs"]["ENVS_STATE_REDIS_URL"] = f"redis://127.0.0.1:{state_port}/0"  # the same
    if getattr(args, "data", None):
        env["envs"]["ENVS_GSM8K_DIR"] = str(Path(args.data).resolve())
    if getattr(args, "host", None):  # only the gateway is public; the rest stay on loopback
        env["gateway"]["GATEWAY_HOST"] = args.host
    if getattr(args, "keys", None):  # auth on: GATEWAY_KEY_SECRET comes from the environment
        env["gateway"]["GATEWAY_KEYS_FILE"] = str(Path(args.keys).resolve())
    if args.judge_base_url:
        env["judge"]["JUDGE_BASE_URL"] = args.judge_base_url
    if args.judge_model:
        env["judge"]["JUDGE_MODEL"] = args.judge_model
    skip = {"embedding"} if args.no_embedding else set()
    if not args.judge_base_url:
        skip.add("judge")
    if sandbox_off(args):
        skip.add("sandbox")
    for name in SERVICES:  # the gateway comes last: it needs the others' URLs
        if name in skip:
            continue
        proc = service_process(
            name,
            getattr(args, f"{name}_port", None),  # None: the service's own port setting
            env=env[name],
            log_path=logs / f"{name}.log",
            # ready: verify's workers, the embedder's model, a sandbox started and checked
            ready_path="/readyz" if name in ("verify", "embedding", "sandbox") else "/healthz",
        )
        if name == "sandbox":
            proc.rlimits = sandbox_rlimits()
        procs.append(proc)
        if name != "gateway":
            env["gateway"][f"GATEWAY_{name.upper()}_URL"] = f"http://127.0.0.1:{proc.port}"
        if name in ("verify", "sandbox"):  # the environments' rewards and code runs
            env["envs"][f"ENVS_{name.upper()}_URL"] = f"http://127.0.0.1:{proc.port}"
    return procs


def sample_groups(data_dir: Path, n: int) -> list[dict[str, Any]]:
    """n GSM8K test problems, each with responses a policy might give: right, wrong, sloppy."""
    groups = []
    with (data_dir / "test.jsonl").open() as f:
        for i, line in zip(range(n), f, strict=False):
            row = json.loads(line)
            gold = row["answer"].split("####")[-1].strip()
            responses = [
                f"<think>{row['answer'].split('####')[0].strip()}</think><answer>{gold}</answer>",
                f"<think>I guess.</think><answer>{int(gold.replace(',', '')) + 1}</answer>",
                f"The answer is {gold}.",
            ]
            groups.append(
                {"id": f"test-{i}", "prompt": row["question"], "reference": row["answer"],
                 "responses": responses}
            )  # fmt: skip
    return groups


def _start_sandbox(proc: ManagedProcess, procs: list[ManagedProcess]) -> bool:
    """Start the sandbox; where it does not start (user namespaces refused, ...), say why in
    one line, stop it and leave the gateway and the envs service without it."""
    proc.start()
    try:
        proc.wait_ready(timeout=60)
        return True
    except (RuntimeError, TimeoutError):
        proc.stop()
        for other in procs:
            other.env.pop("GATEWAY_SANDBOX_URL", None)
            other.env.pop("ENVS_SANDBOX_URL", None)
        lines = proc.log_path.read_text(errors="replace").splitlines() if proc.log_path else []
        why = next((ln for ln in reversed(lines) if "bwrap" in ln or "Error" in ln), "")
        why = why.rsplit("SandboxFailure: ", 1)[-1].replace("\\n", " ").strip()[:300]
        log.warning("sandbox did not start (%s; log: %s): recipes code and code-all are not "
                    "configured", why or "no reason in its log", proc.log_path)  # fmt: skip
        return False


def print_recipes(gateway: str) -> None:
    """The gateway's recipes, those it cannot serve with the reason's service (GET /v1/recipes)."""
    key = os.environ.get("ARBITER_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.get(f"{gateway}/v1/recipes", headers=headers, timeout=10)
        r.raise_for_status()
        recipes = r.json()["recipes"]
    except (httpx.HTTPError, ValueError, KeyError):
        return  # auth on without a key: nothing to show
    ok = [x["name"] for x in recipes if x.get("available", True)]
    off = [x["name"] for x in recipes if not x.get("available", True)]
    print(f"  recipes    {', '.join(ok)}")
    if off:
        print(f"             not configured here: {', '.join(off)}")


def _fmt(value: float | None) -> str:
    return "null" if value is None else f"{value:.3f}"


def score_samples(gateway: str, data_dir: Path, n: int, recipe: str) -> None:
    body = {"recipe": recipe, "groups": sample_groups(data_dir, n)}
    key = os.environ.get("ARBITER_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(f"{gateway}/v1/score", json=body, headers=headers, timeout=120)
    r.raise_for_status()
    out = r.json()
    print(f"\nrecipe {out['recipe']['name']} ({out['recipe']['fingerprint'][:19]}…)")
    print(f"{'group':<8} {'resp':>4}  {'reward':>7}  components")
    for g in out["groups"]:
        for j, reward in enumerate(g["rewards"]):
            comps = "  ".join(f"{k}={_fmt(v[j])}" for k, v in g["components"].items())
            shown = "null" if reward is None else f"{reward:.3f}"
            print(f"{g['id']:<8} {j:>4}  {shown:>7}  {comps}")
    print(f"usage: {out['usage']}\n")


def up(args: argparse.Namespace) -> int:
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.data) if args.data else gsm8k.default_dir()
    keys = getattr(args, "keys", None)
    if keys and not Path(keys).is_file():
        log.error("--keys %s: no such file; create it with "
                  "`arbiter keys create --team NAME --file %s`", keys, keys)  # fmt: skip
        return 1
    resolve_ports(args)
    procs = _plan(args, logs)
    busy = [f"{p.name}:{p.port}" for p in procs if p.port is not None and not _port_free(p.port)]
    if busy:
        log.error("ports in use (%s); is another stack running?", ", ".join(busy))
        return 1

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    watchdog = Watchdog()  # ends every child's group if this process dies, even by SIGKILL
    for proc in procs:
        proc.watchdog = watchdog
    started: list[ManagedProcess] = []
    off = sandbox_off(args)
    if off and off != "--no-sandbox":
        log.warning("sandbox not started (%s): recipes code and code-all are not configured", off)
    try:
        for proc in procs:
            log.info("starting %s", proc.name)
            if proc.name == "sandbox":
                if _start_sandbox(proc, procs):
                    started.append(proc)
                continue
            started.append(proc.start())
            proc.wait_ready(timeout=180)
        gateway = f"http://127.0.0.1:{procs[-1].port}"
        recipe = "gsm8k-diverse" if not args.no_embedding else "gsm8k"
        if keys and not os.environ.get("ARBITER_API_KEY") and args.samples > 0:
            log.warning("auth is on and ARBITER_API_KEY is unset; skipping the sample scores")
        elif data_dir.exists() and args.samples > 0:
            score_samples(gateway, data_dir, args.samples, recipe)
        else:
            log.warning("%s; skipping the sample scores", gsm8k.missing(data_dir, "--data DIR"))
        print("Arbiter is up:")
        for proc in started:
            scheme = "redis" if proc.name in ("redis", "state-redis") else "http"
            host = args.host if proc.name == "gateway" and getattr(args, "host", None) else None
            where = f"{scheme}://{host or '127.0.0.1'}:{proc.port}"
            print(f"  {proc.name:<10} {where}   log: {proc.log_path}")
        if not any(p.name == "sandbox" for p in started):
            print(f"  sandbox    not started ({off or 'it did not start; see above'})")
        print_recipes(gateway)
        print(f"  API docs   {gateway}/docs")
        if any(p.name == "envs" for p in started):
            print(f"  envs       {gateway}/ors (ORS), {gateway}/nemo-gym/envs (NeMo Gym)")
        if keys:
            print(f"  auth       on: every /v1/* call needs a key from {keys} "
                  "(Authorization: Bearer <key>)")  # fmt: skip
        else:
            print("  auth       off: anyone who reaches the gateway may score "
                  "(arbiter up --keys FILE turns it on)")  # fmt: skip
        print(f"Point clients, `arbiter score` and the trainer here:\n"
              f"  export ARBITER_URL={gateway}")  # fmt: skip
        print("Ctrl-C stops everything.", flush=True)
        if not args.once:
            supervisor = Supervisor(started)  # a child that exits is restarted, with back-off
            while not stop.wait(0.5):
                supervisor.check()
        return 0
    finally:
        for proc in reversed(started):
            proc.stop()
        watchdog.close()
        log.info("stopped %d processes", len(started))
