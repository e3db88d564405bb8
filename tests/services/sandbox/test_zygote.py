"""One sandbox, many jobs: what a job leaves behind is gone before the next job starts.

A service with a single sandbox (``SANDBOX_WORKERS=1``, no spare) runs every job in the
same zygote, one after another, so each check below is made by the job that follows the
one that tried to leave something: files in ``/tmp``, processes, System V and POSIX IPC,
a listening socket, the job's data in memory. That the zygote was reused is checked on the
metrics (one sandbox started, every job sent to it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import start_service
from tests.services.sandbox.conftest import ENV, group

ONE_SANDBOX = {**ENV, "SANDBOX_WORKERS": "1", "SANDBOX_SPARE": "0"}

LEAVE = """
import os, socket, subprocess
def f():
    open('/tmp/left-behind', 'w').write('x')
    os.mkdir('/tmp/dir-left-behind')
    server = socket.socket()
    server.bind(('127.0.0.1', 47011))
    server.listen()
    globals()['server'] = server
    if os.fork() == 0:  # a child that would outlive the job
        os.setsid()
        import time
        time.sleep(60)
    secret = 'zygote-' + 'marker-' + '7f3a'
    globals()['kept'] = secret * 3
    return 1
"""

FIND = """
import gc, glob, os, socket
def f():
    found = glob.glob('/tmp/*') + glob.glob('/tmp/.*')
    marker = 'zygote-' + 'marker-' + '7f3a'
    strings = (r for o in gc.get_objects() for r in gc.get_referents(o) if isinstance(r, str))
    in_memory = ['marker in memory' for r in strings if marker in r and r is not marker][:1]
    probe = socket.socket()
    taken = probe.connect_ex(('127.0.0.1', 47011)) == 0
    children = []
    for pid in range(2, 4096):  # PID 1, this process and the checker, nothing else
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        if pid != os.getpid():
            children.append(pid)
    children = ['some'] if len(children) > 1 else []
    left = found + in_memory + (['port 47011 still listening'] if taken else []) + children
    return left
"""


@pytest.fixture(scope="module")
def one_sandbox(log_dir: Path) -> Iterator[str]:
    proc, url = start_service("sandbox", log_dir, ONE_SANDBOX)
    yield url
    proc.stop()


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, name
    return float(found.group(1))


def _score(url: str, reference: str, program: str) -> dict:
    r = httpx.post(
        f"{url}/v1/code_tests",
        json={"groups": [group(reference, program)], "params": {}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body: dict = r.json()["groups"][0]
    return body


def test_the_next_job_in_the_same_sandbox_finds_nothing_left(one_sandbox: str) -> None:
    started = _metric(one_sandbox, "sandbox_started_total")
    jobs = _metric(one_sandbox, "sandbox_jobs_total")
    for _ in range(3):
        left = _score(one_sandbox, "assert f() == 1\n", LEAVE)
        assert left["scores"] == [1.0], left
        found = _score(one_sandbox, "assert f() == [], f()\n", FIND)
        assert found["scores"] == [1.0], found["info"]
    # the same sandbox ran all six jobs: none was started for them
    assert _metric(one_sandbox, "sandbox_started_total") == started
    assert _metric(one_sandbox, "sandbox_jobs_total") == jobs + 6


def test_a_job_cannot_mount_or_make_namespaces(one_sandbox: str) -> None:
    # the zygote may mount (its user namespace's CAP_SYS_ADMIN); a job's processes have no
    # capability left: unshare and mount are refused (EPERM) like any unprivileged user's
    program = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def f():\n"
        "    out = []\n"
        "    for call in (lambda: libc.unshare(0x20000),\n"
        "                 lambda: libc.mount(b'none', b'/tmp', b'tmpfs', 0, None),\n"
        "                 lambda: libc.mount(b'none', b'/', None, 32 | 1, None)):\n"
        "        out.append((call(), ctypes.get_errno()))\n"
        "    return out\n"
    )
    body = _score(one_sandbox, "assert f() == [(-1, 1)] * 3, f()\n", program)
    assert body["scores"] == [1.0], body["info"]
