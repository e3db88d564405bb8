"""``arbiter serve NAME``: real processes, settings from the environment, flags override,
one log line per record with the service name, at the level the settings give."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from arbiter.procs import ManagedProcess, free_port, service_process
from arbiter.serve import SERVICES, default_port
from arbiter.services.common.logs import LineFormatter

# <UTC time> <service> <LEVEL> <logger>: <message>
LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (?P<service>\w+) "
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<logger>[\w.]+): (?P<message>.*)$"
)


def _serve(argv: list[str], env: dict[str, str], log_path: Path, port: int) -> ManagedProcess:
    proc = ManagedProcess(
        name="serve",
        argv=[sys.executable, "-m", "arbiter.cli", "serve", *argv],
        env=env,
        ready_url=f"http://127.0.0.1:{port}/healthz",
        log_path=log_path,
        port=port,
    )
    proc.start()
    try:
        proc.wait_ready(60)
    except Exception:
        proc.stop()
        raise
    return proc


def _lines(path: Path) -> list[re.Match[str]]:
    text = path.read_text()
    matches = [LINE.match(line) for line in text.splitlines() if line]
    assert all(matches), f"lines not in the one format:\n{text}"
    return [m for m in matches if m]


@pytest.mark.parametrize(
    ("service", "env"),
    [
        ("gateway", {}),  # no component URLs needed to answer /healthz
        ("verify", {"VERIFY_WORKERS": "1"}),
        # the embedding model loads in the background: /healthz answers before it is ready
        ("embedding", {"EMBEDDING_DEVICE": "cpu"}),
        ("judge", {}),  # the judge server is only contacted by /readyz and requests
    ],
)
def test_each_service_serves_on_the_port_its_settings_give(
    service: str, env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    prefix = service.upper()
    log = tmp_path / f"{service}.log"
    proc = _serve([service], {**env, f"{prefix}_PORT": str(port)}, log, port)
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert r.status_code == 200 and r.json() == {"status": "ok"}
    finally:
        proc.stop()
    assert {m["service"] for m in _lines(log)} == {service}


def test_flags_override_settings_and_the_level_filters(tmp_path: Path) -> None:
    # VERIFY_PORT names a port the flag overrides; at warning level the start-up info
    # lines (uvicorn's and the service's own) are not written.
    port, ignored = free_port(), free_port()
    log = tmp_path / "verify.log"
    env = {"VERIFY_PORT": str(ignored), "VERIFY_LOG_LEVEL": "warning", "VERIFY_WORKERS": "1"}
    proc = _serve(["verify", "--port", str(port), "--host", "127.0.0.1"], env, log, port)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{ignored}/healthz", timeout=2)
    finally:
        proc.stop()
    assert all(m["level"] in ("WARNING", "ERROR", "CRITICAL") for m in _lines(log))


def test_debug_level_and_access_log(tmp_path: Path) -> None:
    # debug shows the service's own info lines and uvicorn's; VERIFY_ACCESS_LOG adds one
    # line per request. (Off by default: per-request lines cost CPU at high rates.)
    port = free_port()
    log = tmp_path / "verify.log"
    env = {"VERIFY_LOG_LEVEL": "debug", "VERIFY_ACCESS_LOG": "true", "VERIFY_WORKERS": "1"}
    proc = _serve(["verify", "--port", str(port)], env, log, port)
    try:
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        proc.stop()
    lines = _lines(log)
    loggers = {m["logger"] for m in lines}
    assert {"arbiter.verify", "uvicorn.error", "uvicorn.access"} <= loggers, loggers
    assert any('"GET /healthz HTTP/1.1" 200' in m["message"] for m in lines)


def test_service_process_defaults_to_the_settings_port() -> None:
    # procs (arbiter up, the tests) take the port from the settings, not from a copy.
    for name in SERVICES:
        proc = service_process(name)
        assert proc.port == default_port(name)
        assert proc.argv[-4:] == ["serve", name, "--port", str(default_port(name))]
    assert {n: default_port(n) for n in SERVICES} == {
        "gateway": 8000, "verify": 8001, "embedding": 8002, "judge": 8003, "sandbox": 8004,
        "envs": 8005,
    }  # fmt: skip


def test_bad_settings_exit_before_start_naming_the_variable(tmp_path: Path) -> None:
    env = {"VERIFY_LOG_LEVEL": "loud"}
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.cli", "serve", "verify", "--port", str(free_port())],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "invalid settings" in done.stderr and "VERIFY_LOG_LEVEL: " in done.stderr


def test_a_traceback_stays_on_one_line() -> None:
    formatter = LineFormatter("gateway")
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.LogRecord("arbiter.x", logging.ERROR, __file__, 1, "failed", None, None)
        record.exc_info = sys.exc_info()
    line = formatter.format(record)
    assert "\n" not in line and "ValueError: boom\\nsecond line" in line
    match = LINE.match(line)
    assert match and match["service"] == "gateway" and match["logger"] == "arbiter.x"


# ---------------------------------------------------------------- several processes, one port


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (event-loop children, forkservers, pool workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid_ = int(stat.parent.name)
            children.setdefault(_ppid(pid_), []).append(pid_)
        except (OSError, IndexError, ValueError):
            continue
    out: set[int] = set()
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out.update(kids)
        todo.extend(kids)
    return out


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def _gone(pids: set[int], timeout: float) -> set[int]:
    """Wait up to ``timeout`` for ``pids`` to end; return those still alive."""
    deadline = time.monotonic() + timeout
    while (left := {p for p in pids if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _socket_owners(port: int) -> dict[int, int]:
    """Established server-side connections on 127.0.0.1:``port`` → the pid holding each:
    /proc/net/tcp gives each connection's socket inode, /proc/PID/fd who holds it."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":  # ESTABLISHED
            inodes.add(int(fields[9]))
    owners: dict[int, int] = {}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            links = [os.readlink(fd) for fd in fd_dir.iterdir()]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                owners[int(link[8:-1])] = int(fd_dir.parent.name)
    return owners


def _listening(port: int) -> int:
    """How many sockets listen on ``port`` (/proc/net/tcp, state 0A)."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return sum(1 for row in rows if int(row[1].split(":")[1], 16) == port and row[3] == "0A")


def _serve_two(tmp_path: Path) -> tuple[ManagedProcess, int]:
    port = free_port()
    env = {"VERIFY_WORKERS": "1", "VERIFY_LOG_LEVEL": "warning"}
    proc = _serve(["verify", "--port", str(port), "--workers", "2"], env,
                  tmp_path / "verify.log", port)  # fmt: skip
    # /healthz answers once one process listens; each listens after its own start-up.
    deadline = time.monotonic() + 60
    while _listening(port) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _listening(port) == 2, "both processes listen on the one port"
    return proc, port


def test_two_processes_share_the_port_and_both_take_connections(tmp_path: Path) -> None:
    # 32 fresh keep-alive connections, each answered, then held open: the kernel's
    # SO_REUSEPORT hash gives each process some (all on one process: odds 2^-31), and the
    # connections are held by the two children, not by the parent.
    proc, port = _serve_two(tmp_path)
    conns = []
    try:
        assert proc.proc is not None
        for _ in range(32):
            conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            conns.append(conn)
            conn.sendall(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.1 200"), "every connection is answered"
        owners = set(_socket_owners(port).values())
        children = _descendants(proc.proc.pid)
        assert len(owners) == 2, owners
        assert owners <= children and proc.proc.pid not in owners
        with httpx.Client() as client:  # the service itself, through any process
            r = client.post(f"http://127.0.0.1:{port}/v1/math", timeout=30, json={
                "groups": [{"reference": "#### 72", "responses": ["#### 72"]}], "params": {},
            })  # fmt: skip
        assert r.status_code == 200 and r.json()["groups"][0]["scores"] == [1.0]
    finally:
        for conn in conns:
            conn.close()
        proc.stop()


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGTERM,  # forwarded to the children: a clean stop, status 0
        signal.SIGKILL,  # cannot be forwarded: the kernel's PDEATHSIG ends the children
    ],
)
def test_no_process_outlives_the_parent(sig: signal.Signals, tmp_path: Path) -> None:
    proc, _ = _serve_two(tmp_path)
    assert proc.proc is not None
    below = _descendants(proc.proc.pid)
    assert len(below) >= 4, below  # 2 event-loop processes, each with its pool
    os.kill(proc.proc.pid, sig)  # the parent alone, not its group
    code = proc.proc.wait(30)
    assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    assert not _gone(below, 30), "processes outlived `arbiter serve`"


def test_a_child_that_dies_stops_the_service(tmp_path: Path) -> None:
    # Half a service is not left running: the parent stops the other process and exits 1,
    # so a supervisor (arbiter up, k8s) restarts the whole of it.
    proc, _ = _serve_two(tmp_path)
    assert proc.proc is not None
    below = _descendants(proc.proc.pid)
    # the two event-loop processes (the parent's other child is multiprocessing's tracker)
    children = [
        p
        for p in below
        if _ppid(p) == proc.proc.pid and b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    assert len(children) == 2
    os.kill(children[0], signal.SIGKILL)
    assert proc.proc.wait(30) == 1
    assert not _gone(below, 30)
    assert "exited (code -9); stopping the others" in (tmp_path / "verify.log").read_text()
