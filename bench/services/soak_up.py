"""The stack the soak's edge cases run on: ``arbiter up --keys FILE --port-base N``, as an
operator starts it (both Redis, verify, embedding, the gateway; no sandbox, which no case
uses), in a process of its own, its settings from the environment given to it.

The soak needs three things ``arbiter up`` does not print: the gateway's URL (port base
N), the two Redis processes (to stop and continue them: SIGSTOP is a stall, not an outage,
so the gateway's connections hang until their timeout) and the state Redis itself (to read
what the teams' state holds). ``arbiter up`` ends every child when it gets SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import redis

from arbiter.stack import PORT_OFFSETS

READY_S = 300  # embedding loads its model; on a busy 2-core VM the stack takes a minute or two


@dataclass
class Up:
    base: int
    proc: subprocess.Popen[bytes]
    logs: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.base + PORT_OFFSETS['gateway']}"

    def state_redis(self) -> redis.Redis:
        port = self.base + PORT_OFFSETS["state_redis"]
        return redis.Redis(port=port, socket_timeout=10, decode_responses=True)

    def redis_pids(self) -> list[int]:
        """The cache Redis and the state Redis: ``arbiter up``'s children on their ports."""
        ports = [f":{self.base + PORT_OFFSETS[n]}" for n in ("redis", "state_redis")]
        found = []
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                # redis-server sets its title to "/usr/bin/redis-server 127.0.0.1:PORT"
                words = " ".join(child.cmdline()).split()
                if child.name() == "redis-server" and any(
                    w.endswith(p) for w in words for p in ports
                ):
                    found.append(child.pid)
        if len(found) != 2:
            raise RuntimeError(f"expected two redis-server children of arbiter up, found {found}")
        return found

    def signal_redis(self, sig: signal.Signals) -> None:
        for pid in self.redis_pids():
            os.kill(pid, sig)


def _free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def free_base() -> int:
    """A port base whose seven ports (gateway .. state Redis) are all free."""
    span = max(PORT_OFFSETS.values()) + 1
    for _ in range(200):
        base = random.randrange(20_000, 60_000)
        if all(_free(base + i) for i in range(span)):
            return base
    raise RuntimeError("no free port base found")


@contextlib.contextmanager
def arbiter_up(keys: Path, logs: Path, env: dict[str, str], base: int | None) -> Iterator[Up]:
    """``arbiter up --keys keys --port-base base`` until the block ends; ready when the
    gateway's /readyz answers 200. Its output goes to ``logs/arbiter-up.log``."""
    base = base or free_base()
    logs.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "arbiter.cli", "up", "--keys", str(keys), "--port-base",
            str(base), "--no-sandbox", "--samples", "0", "--logs", str(logs)]  # fmt: skip
    with (logs / "arbiter-up.log").open("wb") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    up = Up(base, proc, logs)
    try:
        deadline = time.monotonic() + READY_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"arbiter up exited {proc.returncode}; see {logs}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{up.url}/readyz", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"arbiter up not ready after {READY_S} s; see {logs}")
            time.sleep(0.5)
        yield up
    finally:
        if proc.poll() is None:
            with contextlib.suppress(RuntimeError, OSError):  # a stopped Redis holds up the stop
                up.signal_redis(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
