"""Start, wait for and stop local processes: used by ``arbiter up`` and by the tests.

Every child runs in its own process group so that stopping it also stops whatever it
spawned (uvicorn workers, process pools). ``stop`` sends SIGTERM, then SIGKILL. With a
``Watchdog`` (``arbiter up``) the groups are also ended when this process dies, however it
dies; see ``arbiter.supervise``.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from arbiter.supervise import Watchdog, die_with_parent


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_url: str | None = None
    log_path: Path | None = None
    port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    # Ends this child's group when the starting process dies (see arbiter.supervise).
    watchdog: Watchdog | None = None
    # resource limits set on the child as it starts, {RLIMIT_*: (soft, hard)}: its children
    # inherit them
    rlimits: dict[int, tuple[int, int]] = field(default_factory=dict)

    def start(self) -> ManagedProcess:
        """Start (or, after it exited, start again) the process in a group of its own."""
        env = {**os.environ, **self.env}
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        if self.proc is not None:  # a restart: what the previous run left in its group goes
            self._kill_leftovers()
            if self.watchdog is not None:
                self.watchdog.forget(self.proc.pid)
        self.proc = subprocess.Popen(
            self.argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # prctl in the child: only with a watchdog (arbiter up, single-threaded)
            preexec_fn=die_with_parent if self.watchdog is not None else None,
        )
        if self.watchdog is not None:
            self.watchdog.watch(self.proc.pid)
        for limit, values in self.rlimits.items():  # before it starts any child of its own
            resource.prlimit(self.proc.pid, limit, values)
        return self

    def _kill_leftovers(self) -> None:
        """SIGKILL the group of a process that has exited (its orphaned children)."""
        if self.proc is not None and self.proc.poll() is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll ``ready_url`` (200 means ready) or, for non-HTTP processes, the port."""
        deadline = time.monotonic() + timeout
        last = "not started"
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"{self.name} exited early ({last}); log: {self.log_path}")
            if self.ready_url is None:
                if self.port is not None:
                    wait_port(self.port, max(0.1, deadline - time.monotonic()))
                return
            try:
                r = httpx.get(self.ready_url, timeout=2.0)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
            time.sleep(0.1)
        raise TimeoutError(
            f"{self.name} not ready after {timeout:.0f}s ({last}); log: {self.log_path}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.watchdog is not None:
            self.watchdog.forget(self.proc.pid)
        if self.proc.poll() is not None:
            self._kill_leftovers()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


def service_process(
    name: str,
    port: int | None = None,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    ready_path: str = "/healthz",
) -> ManagedProcess:
    """Service ``name`` started the way it runs in production: ``arbiter serve NAME``.

    ``port`` defaults to the service's own setting; every other setting comes from the
    environment (this process's, updated with ``env``).
    """
    if port is None:
        from arbiter.serve import default_port

        port = default_port(name)
    argv = [sys.executable, "-m", "arbiter.cli", "serve", name, "--port", str(port)]
    return _http_process(name, argv, port, env, log_path, ready_path)


def uvicorn_process(
    name: str,
    factory: str,
    port: int,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    ready_path: str = "/healthz",
) -> ManagedProcess:
    """An ASGI app that is not an Arbiter service (a test stub): uvicorn with a factory."""
    argv = [
        sys.executable, "-m", "uvicorn", factory, "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    return _http_process(name, argv, port, env, log_path, ready_path)


def _http_process(
    name: str,
    argv: list[str],
    port: int,
    env: dict[str, str] | None,
    log_path: Path | None,
    ready_path: str,
) -> ManagedProcess:
    """A loopback HTTP server process, ready when ``ready_path`` answers 200."""
    return ManagedProcess(
        name=name,
        argv=argv,
        env=env or {},
        ready_url=f"http://127.0.0.1:{port}{ready_path}",
        log_path=log_path,
        port=port,
    )


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    raise FileNotFoundError(
        "redis-server not found: install it with `apt-get install -y redis-server` "
        "(make run / make test do this)"
    )


# Redis's memory bound and eviction, as docker-compose.yml and k8s set them: a cache that
# evicts its least recently used keys instead of growing without bound.
REDIS_MAXMEMORY = "1gb"  # ARBITER_REDIS_MAXMEMORY, as in compose
REDIS_POLICY = "allkeys-lru"
# The teams' state (usage ledger, quotas, idempotency keys) in a Redis of its own that never
# evicts: full, it refuses writes (the gateway's Redis-failure paths) instead of dropping a
# ledger. Its size is bounded by GATEWAY_IDEMPOTENCY_TEAM_BYTES per team plus small records.
STATE_REDIS_MAXMEMORY = "1gb"  # ARBITER_STATE_REDIS_MAXMEMORY, as in compose
STATE_REDIS_POLICY = "noeviction"


def redis_process(
    port: int,
    log_path: Path | None = None,
    maxmemory: str | None = None,
    data_dir: Path | None = None,
    policy: str = REDIS_POLICY,
    name: str = "redis",
) -> ManagedProcess:
    """A real redis-server on 127.0.0.1 only, bounded like compose's. With ``data_dir`` it
    persists as compose and k8s do: an append-only file there, fsynced every second (the
    usage ledger, quotas and idempotency keys survive a restart; at most the last second
    is lost to a crash of the machine, none to a crash of Redis). Without: nothing."""
    maxmemory = maxmemory or os.environ.get("ARBITER_REDIS_MAXMEMORY") or REDIS_MAXMEMORY
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        persistence = ["--dir", str(data_dir), "--appendonly", "yes", "--appendfsync", "everysec"]
    else:
        persistence = ["--appendonly", "no"]
    argv = [
        redis_binary(), "--bind", "127.0.0.1", "--port", str(port),
        "--save", "", *persistence, "--protected-mode", "yes",
        "--maxmemory", maxmemory, "--maxmemory-policy", policy,
    ]  # fmt: skip
    return ManagedProcess(name=name, argv=argv, log_path=log_path, port=port)


def state_redis_process(
    port: int,
    log_path: Path | None = None,
    data_dir: Path | None = None,
    maxmemory: str | None = None,
) -> ManagedProcess:
    """The state Redis (``GATEWAY_STATE_REDIS_URL``): ``noeviction``, append-only file in
    ``data_dir``, so no cache entry can push a ledger, quota or idempotency key out."""
    maxmemory = (
        maxmemory or os.environ.get("ARBITER_STATE_REDIS_MAXMEMORY") or STATE_REDIS_MAXMEMORY
    )
    return redis_process(
        port, log_path, maxmemory, data_dir, policy=STATE_REDIS_POLICY, name="state-redis"
    )


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")
