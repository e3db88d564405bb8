"""A program's failure stays its own: it never becomes a sandbox error, never reaches PID 1
or the next job (ptys, /tmp, siblings, signals, output floods), and a grader's odd value is
the grader's failure.

One sandbox (``SANDBOX_WORKERS=1``, no spare) runs every job, so what a job leaves behind
meets the next one. Each test checks that an attack is refused; the comment above a test
says what the attack did before the sandbox was fixed against it.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arbiter.services.sandbox.memory import HARNESS_MB
from tests.conftest import start_service
from tests.services.sandbox.conftest import ENV, group

# 128 MB each process: /tmp, PID 1's own and 9 processes (the program's 8 and the checker)
ONE_SANDBOX = {**ENV, "SANDBOX_WORKERS": "1", "SANDBOX_SPARE": "0"}
ONE_SANDBOX |= {"SANDBOX_MEMORY_MB": str(64 + HARNESS_MB + 9 * 128)}
ONE_SANDBOX |= {"SANDBOX_TEST_TIMEOUT_S": "5", "SANDBOX_ITEM_TIMEOUT_S": "8"}
ONE_SANDBOX |= {"SANDBOX_TMP_MB": "64", "SANDBOX_MAX_TESTS": "2500"}


def _unix_gc() -> None:
    """Closing any unix socket makes the kernel collect descriptors left in flight (the
    attacks below leave some): nothing of theirs outlives this module."""
    a, b = socket.socketpair()
    a.close()
    b.close()


@pytest.fixture(scope="module")
def url(log_dir: Path) -> Iterator[str]:
    proc, base = start_service("sandbox", log_dir, ONE_SANDBOX)
    yield base
    proc.stop()
    _unix_gc()


def _post(url: str, component: str, groups: list[dict[str, Any]], **params: Any) -> dict:
    body = {"groups": groups, "params": params}
    r = httpx.post(f"{url}/v1/{component}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer: dict = r.json()["groups"][0]
    return answer


def _score(url: str, reference: str, program: str, **params: Any) -> dict:
    return _post(url, "code_tests", [group(reference, program)], **params)


def _started(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^sandbox_started_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _settled(url: str) -> None:
    """The sandbox free again (a plain job waits for the earlier job's namespace to go)."""
    assert _score(url, "assert f() == 1\n", "def f():\n    return 1\n")["scores"] == [1.0]


def _shmem_mb() -> int:
    """The host's memory in tmpfs and shared memory, in MB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) >> 10
    return 0


# the run's nonce, found in memory as the first review did (the closure of the harness's `say`)
NONCE = """
import gc, os
def _nonce():
    say = [o for o in gc.get_objects() if callable(o) and getattr(o, '__name__', '') == 'say']
    return [c.cell_contents for c in say[0].__closure__ if isinstance(c.cell_contents, str)][0]
"""

# an SCM_RIGHTS cycle: descriptors sent on a unix socket to itself outlive every process of
# the job, held by the kernel until its unix garbage collector runs (any unix socket of the
# host closing starts it; nothing in the sandbox's path closes one)
IN_FLIGHT = """
import os, socket
def keep(*fds):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    socket.send_fds(a, [b'x'], [*fds, a.fileno(), b.fileno()])
"""


# Was a finding (fixed): PID 1 keeps a result frame's reason uncut (up to FRAME_LIMIT, 128 KB); a
# stopping frame ('X') is copied to every test left and dump escapes each control character to six
# bytes, so the answer line passes the service's 4 MB ANSWER_LIMIT: the service kills the sandbox
# and the failing response is null sandbox_error
def test_a_forged_reason_cannot_turn_a_failure_into_a_sandbox_error(url: str) -> None:
    program = NONCE + (
        "def f():\n"
        "    os.write(3, f'{_nonce()} X -1 '.encode() + b'\\x01' * 120000 + b'\\n')\n"
        "    os._exit(1)\n"
    )
    reference = "".join(f"assert f() == {i}\n" for i in range(8))
    body = _score(url, reference, program)
    assert body["scores"] == [0.0], body


# Was a finding (fixed): the jobs of a zygote share bwrap's one devpts instance; a pty whose master
# is kept in flight outlives its job, and the next job opens /dev/pts/N and reads what the first
# wrote (a channel between jobs, any team's)
def test_a_pty_kept_in_flight_does_not_reach_the_next_job(url: str) -> None:
    leave = IN_FLIGHT + (
        "def f():\n    m, s = os.openpty()\n    os.write(m, b'from-the-first-job\\n')\n"
        "    keep(m, s)\n    return 1\n"
    )
    find = (
        "import os\ndef f():\n    out = []\n    for n in os.listdir('/dev/pts'):\n"
        "        if n.isdigit():\n"
        "            fd = os.open('/dev/pts/' + n, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)\n"
        "            try:\n                out.append(os.read(fd, 100))\n"
        "            except OSError:\n                pass\n    return out\n"
    )
    try:
        for _ in range(3):  # the unix GC may run between two jobs: three tries
            assert _score(url, "assert f() == 1\n", leave)["scores"] == [1.0]
            body = _score(url, "r = f()\nassert r == [], r\n", find)
            assert body["scores"] == [1.0], body["info"]
    finally:
        _unix_gc()


# Was a finding (fixed): a descriptor of a file in the job's /tmp kept in flight keeps that whole
# tmpfs (SANDBOX_TMP_MB) after the job's mount namespace is gone; each job adds its /tmp to the
# host's memory, outside every limit, until the kernel's unix GC happens to run
def test_a_tmp_kept_in_flight_holds_no_memory_past_its_job(url: str) -> None:
    leave = IN_FLIGHT + (
        "def f():\n    for n in range(4):\n        with open(f'/tmp/x{n}', 'wb') as w:\n"
        "            w.write(b'x' * (15 << 20))\n"  # under SANDBOX_MAX_FILE_MB each
        "    keep(os.open('/tmp/x0', os.O_RDONLY))\n    return 1\n"
    )
    _settled(url)
    try:
        before = _shmem_mb()
        for _ in range(3):
            assert _score(url, "assert f() == 1\n", leave)["scores"] == [1.0]
            _settled(url)  # the job's namespaces gone: its /tmp unmounted
            # the kernel frees it once its unix garbage collection has run (asynchronous):
            # held for good before, 60 MB more a job
            deadline = time.monotonic() + 5
            while (held := _shmem_mb() - before) >= 40:
                assert time.monotonic() < deadline, f"{held} MB of the jobs' /tmp still held"
                time.sleep(0.05)
    finally:
        _unix_gc()


# Was a finding (fixed): without the nonce, each failed test's reason is 300 characters of the
# program's choosing, six bytes each once escaped (control characters): past ~2,300 tests
# (SANDBOX_MAX_TESTS allows 10,000) the answer line passes the 4 MB ANSWER_LIMIT and a failing
# response is null sandbox_error
def test_many_failed_tests_cannot_turn_a_failure_into_a_sandbox_error(url: str) -> None:
    program = "def f(i):\n    assert False, chr(1) * 300\n"
    reference = "".join(f"assert f({i}) == 1\n" for i in range(2500))
    body = _score(url, reference, program, mode="fraction")
    assert body["scores"] == [0.0], body["errors"]


# Refused: signals to PID 1 (a session leader now) from the program and from a grandchild in a
# session of its own: job control, hangup and the rest are ignored (PID 1 has no handler), the
# test fails as the program's own, the next test runs and the sandbox is not replaced
def test_job_control_and_hangup_signals_do_not_reach_pid_1(url: str) -> None:
    program = """
import os, signal, time
SIGNALS = ('SIGHUP', 'SIGTSTP', 'SIGTTOU', 'SIGTTIN', 'SIGSTOP', 'SIGCONT', 'SIGTERM',
           'SIGQUIT', 'SIGUSR1', 'SIGALRM', 'SIGXCPU', 'SIGXFSZ', 'SIGPIPE', 'SIGCHLD')
def hit():
    for name in SIGNALS:
        os.kill(1, getattr(signal, name))
def f():
    if os.fork() == 0:
        os.setsid()
        hit()
        os._exit(0)
    os.wait()
    hit()
    time.sleep(0.2)
    return 0
def g():
    return 2
"""
    _settled(url)
    started = _started(url)
    body = _score(url, "assert f() == 1\nassert g() == 2\n", program, mode="fraction")
    assert body["scores"] == [0.5], body
    assert _started(url) == started


# Refused: a process cloned with CLONE_PARENT (a child of PID 1 that PID 1 did not start) is
# swept with the rest, and CLONE_NEWTIME needs the capability the job dropped
def test_a_sibling_of_the_program_is_swept_and_no_time_namespace(url: str) -> None:
    program = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
def f():
    pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT | SIGCHLD)
    if pid == 0:
        while True:
            time.sleep(1)
    time.sleep(0.1)
    return [pid > 0, libc.unshare(0x80), ctypes.get_errno()]  # CLONE_NEWTIME: EPERM
def g():
    return 2
"""
    _settled(url)
    started = _started(url)
    reference = "r = f()\nassert r == [True, -1, 1], r\nassert g() == 2\n"
    body = _score(url, reference, program, mode="fraction")
    assert body["scores"] == [1.0], body
    _settled(url)
    assert _started(url) == started


# Refused: grandchildren keep a stdio test's stdout and stderr full after the program exits;
# they are killed before the pipes are drained and the output limit bounds what is read
def test_flooding_the_output_pipes_after_exit_fails_the_test_only(url: str) -> None:
    program = """
import fcntl, os
for fd in (1, 2):
    fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ
for _ in range(3):
    if os.fork() == 0:
        while True:
            os.write(1, b'1\\n' * 32768)
            os.write(2, b'e' * 65536)
print(1)
os._exit(0)
"""
    reference = '[{"input": "", "output": "1"}, {"input": "x", "output": "1"}]'
    _settled(url)
    started = _started(url)
    body = _score(url, reference, program)
    assert body["scores"] == [0.0], body
    assert _started(url) == started


# Refused: odd values from grade() are the grader's own failure (grader_error) or a score,
# never the sandbox's (sandbox_error); the sandbox is not replaced
@pytest.mark.parametrize(
    "value",
    [
        "10 ** 400",
        "float('nan')",
        "True",
        "type('F', (float,), {'__repr__': lambda s: 'inf'})(0.5)",
        "type('I', (int,), {'__float__': lambda s: float('inf')})(1)",
        "1e308 * 10",
        "'\\x01' * 4_000_000",
        "Exception('\\x01' * 4_000_000)",
    ],
)
def test_odd_values_from_grade_are_the_graders_failure(url: str, value: str) -> None:
    source = f"def grade(sample, item):\n    v = {value}\n"
    source += "    if isinstance(v, BaseException):\n        raise v\n    return v\n"
    started = _started(url)
    body = _post(
        url,
        "python_grader",
        [{"id": "g", "prompt": "", "reference": "", "responses": ["x"]}],
        source=source,
    )
    kinds = [e["kind"] for e in body["errors"]]
    assert kinds in ([], ["grader_error"]), body
    assert _started(url) == started
