"""Keep ``arbiter up``'s children alive while it runs, and dead once it is gone.

Three parts:

- ``die_with_parent`` (a ``preexec_fn``): on Linux, ``prctl(PR_SET_PDEATHSIG, SIGTERM)``
  in the child, so the kernel sends it SIGTERM when the process that started it dies,
  however it died (SIGKILL included). A service then shuts down as on any SIGTERM.
- ``Watchdog``: a small process that holds the read end of a pipe from its parent and the
  list of the children's process groups. The kernel closes the pipe when the parent dies;
  on that end-of-file the watchdog sends SIGTERM to every group it still knows, then
  SIGKILL to what is left after a grace period. This also reaches the grandchildren
  (verify's pool workers, the embedding encoder process) that PDEATHSIG does not.
- ``Supervisor``: restarts a child that exited, with exponential back-off (1 s, 2 s, 4 s…
  up to 30 s; back to 1 s once a child has stayed up for a minute), and logs each exit
  and restart.

Run as ``python -m arbiter.supervise`` it is the watchdog (its protocol on stdin: a line
``+PGID`` to watch a group, ``-PGID`` to forget one).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

log = logging.getLogger("arbiter.up")

PR_SET_PDEATHSIG = 1
GRACE_S = 5.0  # SIGTERM, then this long, then SIGKILL

try:
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the watchdog alone
    _prctl = None


def die_with_parent() -> None:
    """``preexec_fn``: SIGTERM this child when its parent dies (Linux; a no-op elsewhere)."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_groups(pgids: Sequence[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM every group, wait up to ``grace_s`` for them to end, SIGKILL the rest."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(g) for g in pgids):
        time.sleep(0.1)
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def watchdog_main(stdin: IO[str], grace_s: float = GRACE_S) -> None:
    """Read ``+PGID``/``-PGID`` lines until end-of-file, then end the groups still listed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the parent
    groups: set[int] = set()
    for line in stdin:
        line = line.strip()
        if line[:1] == "+":
            groups.add(int(line[1:]))
        elif line[:1] == "-":
            groups.discard(int(line[1:]))
    kill_groups(sorted(groups), grace_s)


class Watchdog:
    """The parent's side: starts the watchdog process and tells it about each child."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "arbiter.supervise"],
            stdin=subprocess.PIPE,
            text=True,
            start_new_session=True,  # not in the parent's group: survives what kills it
        )

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self, timeout: float = GRACE_S + 5) -> None:
        """End-of-file: the watchdog ends what it still watches (nothing, after a clean
        stop) and exits."""
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)


class Child(Protocol):
    name: str

    @property
    def running(self) -> bool: ...

    def start(self) -> object: ...

    def exit_code(self) -> int | None: ...


@dataclass
class _State:
    started: float
    backoff_s: float
    restart_at: float | None = None  # set while a restart is pending
    restarts: int = 0


class Supervisor:
    """Restart children that exit, with back-off; call ``check()`` periodically."""

    def __init__(
        self,
        children: Sequence[Child],
        first_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        stable_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = list(children)
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.stable_s = stable_s
        self.clock = clock
        now = clock()
        self.state = {c.name: _State(started=now, backoff_s=first_backoff_s) for c in children}

    def check(self) -> None:
        now = self.clock()
        for child in self.children:
            st = self.state[child.name]
            if child.running:
                if now - st.started >= self.stable_s:
                    st.backoff_s = self.first_backoff_s  # stayed up: the next exit is news
                continue
            if st.restart_at is None:
                st.restart_at = now + st.backoff_s
                log.error(
                    "%s exited (code %s) after %.1f s; restarting in %g s",
                    child.name, child.exit_code(), now - st.started, st.backoff_s,
                )  # fmt: skip
                continue
            if now >= st.restart_at:
                st.restarts += 1
                st.started, st.restart_at = now, None
                st.backoff_s = min(self.max_backoff_s, st.backoff_s * 2)
                log.warning("restarting %s (restart %d)", child.name, st.restarts)
                child.start()

    def restarts(self, name: str) -> int:
        return self.state[name].restarts


if __name__ == "__main__":
    watchdog_main(sys.stdin)
