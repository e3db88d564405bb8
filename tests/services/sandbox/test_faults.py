"""The sandbox's own failures: not the program's doing, so null with a reason, never a score.

Real faults on a real service of their own: a bubblewrap that cannot run (the service
refuses to start, saying why), and sandboxes killed from outside while a job runs (the
response is null ``sandbox_error``; the service replaces them and goes on).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.procs import free_port, service_process
from tests.conftest import start_service
from tests.services.sandbox.conftest import ENV, group


def test_a_bwrap_that_cannot_run_stops_the_service_at_start(log_dir: Path) -> None:
    # a bwrap that fails as one does on a host without user namespaces, in a directory the
    # sandbox's user (nobody) may enter
    where = Path(tempfile.mkdtemp(prefix="arbiter-broken-bwrap-"))
    where.chmod(0o755)
    broken = where / "bwrap"
    broken.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    log = log_dir / "sandbox-broken.log"
    proc = service_process("sandbox", free_port(), {**ENV, "SANDBOX_BWRAP": str(broken)}, log)
    proc.start()
    try:
        deadline = time.monotonic() + 30
        while proc.exit_code() is None:
            assert time.monotonic() < deadline, "the service started without a working bwrap"
            time.sleep(0.1)
        assert proc.exit_code() != 0
        text = log.read_text()
        assert "did not start" in text and "No permissions to create new namespace" in text
    finally:
        proc.stop()
        shutil.rmtree(where)


def _parents() -> dict[int, int]:
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            out[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def _depth(pid: int, root: int, parents: dict[int, int]) -> int:
    """How far below ``root`` process ``pid`` is (0: not below it)."""
    depth = 0
    while pid in parents and pid != root:
        pid, depth = parents[pid], depth + 1
    return depth if pid == root else 0


def _sandboxes(service_pid: int) -> list[int]:
    """The service's children: its sandboxes (setpriv execs bwrap in place)."""
    return [pid for pid, ppid in _parents().items() if ppid == service_pid]


def _running_programs(service_pid: int) -> int:
    """Processes a harness forked (service → bwrap → harness → program): a job runs."""
    parents = _parents()
    return sum(1 for pid in parents if _depth(pid, service_pid, parents) >= 3)


@pytest.mark.parametrize("component", ["code_tests", "python_grader"])
def test_a_sandbox_killed_from_outside_is_null_sandbox_error(log_dir: Path, component: str) -> None:
    proc, url = start_service("sandbox", log_dir, ENV)
    try:
        assert proc.proc is not None
        body: dict[str, Any]
        if component == "code_tests":
            body = {
                "groups": [
                    group(
                        "assert f() == 1\n", "import time\ntime.sleep(3)\ndef f():\n    return 1\n"
                    )
                ],
                "params": {},
            }
        else:
            source = "import time\ndef grade(sample, item):\n    time.sleep(3)\n    return 1.0\n"
            body = {"groups": [group("", "x")], "params": {"source": source}}
        answer: dict[str, httpx.Response] = {}
        sender = threading.Thread(
            target=lambda: answer.setdefault(
                "r", httpx.post(f"{url}/v1/{component}", json=body, timeout=60)
            )
        )
        sender.start()
        deadline = time.monotonic() + 20
        while not _running_programs(proc.proc.pid):  # its program sleeps for 3 s
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.02)
        for pid in _sandboxes(proc.proc.pid):
            os.kill(pid, signal.SIGKILL)
        sender.join(60)
        r = answer["r"]
        assert r.status_code == 200, r.text
        g = r.json()["groups"][0]
        assert g["scores"] == [None], g
        assert g["errors"][0]["kind"] == "sandbox_error", g
        # new sandboxes replace the killed ones
        body = {"groups": [group("assert f() == 1\n", "def f():\n    return 1\n")], "params": {}}
        r = httpx.post(f"{url}/v1/code_tests", json=body, timeout=60)
        assert r.json()["groups"][0]["scores"] == [1.0], r.text
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    finally:
        proc.stop()
