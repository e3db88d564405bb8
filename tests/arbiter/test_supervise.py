"""``arbiter up`` supervises: a service that dies is restarted (with back-off, logged), and
nothing it started outlives it, even when it is killed with SIGKILL. The Supervisor's
back-off and the watchdog are also tested on their own, with real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from arbiter.procs import ManagedProcess, free_port
from arbiter.supervise import Supervisor, Watchdog
from tests.arbiter.test_stack import _listening, _up_argv


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid → (ppid, pgid, cmdline) of every process (Linux /proc)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry)] = (int(fields[1]), int(fields[2]), cmd)
    return out


def _descendants(root: int) -> set[int]:
    """Every process in the group of any child of ``root`` (children and grandchildren)."""
    table = _proc_table()
    children = {pid for pid, (ppid, _, _) in table.items() if ppid == root}
    groups = {table[pid][1] for pid in children}
    return {pid for pid, (_, pgid, _) in table.items() if pgid in groups} | children


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.2)


def test_up_restarts_a_dead_service_and_dies_whole_on_sigkill(
    tmp_path: Path, gsm8k_dir: Path
) -> None:
    argv, ports = _up_argv(tmp_path, gsm8k_dir, "--no-embedding")
    gateway, verify = ports[0], ports[1]
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if "Ctrl-C stops everything" in line:
                break
        table = _proc_table()
        serve_verify = next(
            pid for pid, (ppid, _, cmd) in table.items()
            if ppid == up.pid and "serve verify" in cmd
        )  # fmt: skip
        # verify dies hard (its whole group, pool workers included)
        os.killpg(serve_verify, signal.SIGKILL)
        _wait(lambda: not _listening(verify), 5, "verify's port closes")
        start = time.monotonic()
        _wait(lambda: _ready(verify), 30, "verify restarted and ready")
        restarted_after = time.monotonic() - start
        body = {"recipe": "gsm8k", "groups": [{"reference": "4", "responses": ["\\boxed{4}"]}]}
        r = httpx.post(f"http://127.0.0.1:{gateway}/v1/score", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["groups"][0]["rewards"][0] is not None, r.text
        assert restarted_after < 20

        everything = _descendants(up.pid)
        assert len(everything) >= 4  # redis, verify (+ its pool), gateway, the watchdog
        up.kill()  # SIGKILL: no cleanup code of arbiter up runs
        up.wait(10)
        _wait(lambda: not any(_alive(p) for p in everything), 15, "every child ends")
        assert not any(_listening(p) for p in ports)
    finally:
        if up.poll() is None:
            up.kill()
        out = up.stdout.read() if up.stdout else ""
    assert "verify exited (code -9)" in out and "restarting verify (restart 1)" in out, out


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _sleeper(tmp_path: Path, watchdog: Watchdog | None = None) -> ManagedProcess:
    # A child that itself starts a grandchild in its group, as verify starts its pool.
    code = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"
    return ManagedProcess(
        name="sleeper", argv=[sys.executable, "-c", code],
        log_path=tmp_path / "sleeper.log", watchdog=watchdog,
    )  # fmt: skip


def test_supervisor_restarts_with_backoff(tmp_path: Path) -> None:
    now = [0.0]
    child = _sleeper(tmp_path).start()
    sup = Supervisor([child], first_backoff_s=1.0, max_backoff_s=4.0, clock=lambda: now[0])
    try:
        for expected_wait in (1.0, 2.0, 4.0, 4.0):  # doubling, capped
            assert child.proc is not None
            os.killpg(child.proc.pid, signal.SIGKILL)
            child.proc.wait(5)
            sup.check()  # notices the exit, schedules the restart
            now[0] += expected_wait - 0.01
            sup.check()
            assert not child.running  # not before its back-off
            now[0] += 0.01
            sup.check()
            assert child.running
        assert sup.restarts("sleeper") == 4
        now[0] += 60.0  # a minute up: the back-off starts over
        sup.check()
        assert sup.state["sleeper"].backoff_s == 1.0
    finally:
        child.stop()


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_watchdog_ends_groups_when_its_parent_dies(tmp_path: Path, how: str) -> None:
    # The parent is a separate Python process that starts a watched child, then dies.
    code = f"""
import os, signal, sys, time
sys.path.insert(0, {str(Path.cwd())!r})
from arbiter.procs import ManagedProcess
from arbiter.supervise import Watchdog
w = Watchdog()
code = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"
p = ManagedProcess(name="c", argv=[sys.executable, "-c", code], watchdog=w).start()
print(p.proc.pid, w.proc.pid, flush=True)
time.sleep(1.0)
if {how!r} == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
os._exit(0)  # no cleanup either way
"""
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid, watchdog_pid = map(int, parent.stdout.readline().split())
    time.sleep(0.5)
    group = {pid for pid, (_, pgid, _) in _proc_table().items() if pgid == child_pid}
    assert len(group) == 2  # the child and its grandchild
    parent.wait(10)
    _wait(lambda: not any(_alive(p) for p in group), 10, "the child's group ends")
    _wait(lambda: not _alive(watchdog_pid), 10, "the watchdog exits")


def test_redis_is_bounded_like_compose(tmp_path: Path) -> None:
    from arbiter.procs import redis_process

    port = free_port()
    proc = redis_process(port, log_path=tmp_path / "redis.log").start()
    try:
        proc.wait_ready(10)
        out = subprocess.run(
            ["redis-cli", "-p", str(port), "config", "get", "maxmemory*"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        got = dict(zip(out[::2], out[1::2], strict=True))
        assert got["maxmemory"] == str(1024**3) and got["maxmemory-policy"] == "allkeys-lru"
    finally:
        proc.stop()
