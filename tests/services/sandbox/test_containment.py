"""Containment: programs that attack the sandbox, the service or their own tests.

Each case is a response run by a real sandbox service (``conftest.sandbox``: 2 s per test,
6 s per response). The program's own failures fail the tests they hit and score what
passed, with the reason per test; nothing a program does reaches the service, its files,
its environment, the network or another run, and the service stays healthy throughout.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import REPO
from tests.services.sandbox.conftest import Sandbox, group, problems

ONE = "def g():\n    return 2\n"  # a second function every case defines: its test passes
TWO_TESTS = "assert f() == 1\nassert g() == 2\n"

# (name, program, tests, score, {failed test: words its reason must contain})
CORPUS: list[tuple[str, str, str, float, dict[str, str]]] = [
    # loops forever before any test: every test fails, none passes
    ("loop at load", "while True:\n    pass\n" + ONE, TWO_TESTS, 0.0, {"0": "timeout"}),
    # loops in one test only: that test times out, the run goes on after it
    (
        "loop in one test",
        "def f(x):\n    while x == 2:\n        pass\n    return x\n",
        "assert f(1) == 1\nassert f(2) == 2\nassert f(3) == 3\n",
        2 / 3,
        {"1": "timeout"},
    ),
    # a fork bomb: RLIMIT_NPROC stops it, the deadline ends it, the sweep kills the rest
    (
        "fork bomb",
        "import os\ndef f():\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n" + ONE,
        TWO_TESTS,
        0.5,
        {"0": "timeout"},
    ),
    # 10 GB: past RLIMIT_AS, a MemoryError fails that test only
    (
        "10 GB allocation",
        "def f():\n    x = bytearray(10 * 1024 ** 3)\n    return 1\n" + ONE,
        TWO_TESTS,
        0.5,
        {"0": "MemoryError"},
    ),
    # / is read-only: only the sandbox's own /tmp takes writes
    (
        "write to /",
        "def f():\n    open('/pwned', 'w').write('x')\n    return 1\n" + ONE,
        TWO_TESTS,
        0.5,
        {"0": "Read-only file system"},
    ),
    # /tmp is bounded: a 1 GB file stops at the file size limit
    (
        "fill /tmp",
        "def f():\n    with open('/tmp/big', 'wb') as fh:\n        for _ in range(1024):\n"
        "            fh.write(b'x' * (1 << 20))\n    return 1\n" + ONE,
        TWO_TESTS,
        0.5,
        {"0": "File too large"},
    ),
    # ptrace of PID 1 (its runner) or of itself: refused (EPERM); its tests pass
    (
        "ptrace",
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "def f():\n    return int(libc.ptrace(16, 1, 0, 0) == -1)\n" + ONE,
        TWO_TESTS,
        1.0,
        {},
    ),
    # the kernel's riskier calls are refused by the seccomp filter (EPERM), not run: keyrings
    # (keyctl would return the session keyring's id), io_uring, bpf, process_vm_readv
    (
        "refused system calls",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def f():\n"
        "    calls = [(250, (0, -3, 0)), (425, (1, 0)), (321, (0, 0, 0)),\n"
        "             (310, (1, 0, 0, 0, 0, 0))]\n"
        "    refused = [libc.syscall(n, *a) == -1 and ctypes.get_errno() == 1 for n, a in calls]\n"
        "    return int(all(refused) or os.uname().machine != 'x86_64')\n" + ONE,
        TWO_TESTS,
        1.0,
        {},
    ),
    # takes a copy of its runner's stdout (the pipe to the service) to forge the answer:
    # pidfd_open works, pidfd_getfd is refused
    (
        "pidfd_getfd of the runner's pipe",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def f():\n    pidfd = libc.syscall(434, 1, 0)\n"
        "    got = libc.syscall(438, pidfd, 1, 0)\n"
        "    return int(pidfd >= 0 and got == -1 and ctypes.get_errno() == 1)\n" + ONE,
        TWO_TESTS,
        1.0,
        {},
    ),
    # signals to its parent, PID 1 and every process: the runner lives on; the checker
    # running the test is killed, which fails that test (never passes it), and the run goes
    # on with a new checker
    (
        "signals to the parent",
        "import os, signal\ndef f():\n"
        "    for pid in (os.getppid(), 1, -1):\n"
        "        for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL):\n"
        "            try:\n                os.kill(pid, sig)\n"
        "            except OSError:\n                pass\n    return 1\n" + ONE,
        TWO_TESTS,
        0.5,
        {"0": "stopped the tests"},
    ),
    # writes to stderr without end: past the output limit the running and remaining tests fail
    (
        "huge stderr",
        "import sys\ndef f():\n    while True:\n        sys.stderr.write('x' * 10000)\n" + ONE,
        TWO_TESTS,
        0.0,
        {"0": "output limit", "1": "output limit"},
    ),
    # prints without end: its stdout is dropped, so the test fails on its CPU time alone
    (
        "huge stdout",
        "def f():\n    while True:\n        print('x' * 10000)\n" + ONE,
        TWO_TESTS,
        0.5,
        {"0": "timeout"},
    ),
    # sleeps past the per-test deadline: that test times out
    (
        "sleep past the deadline",
        "import time\ndef f():\n    time.sleep(100)\n    return 1\n" + ONE,
        TWO_TESTS,
        0.5,
        {"0": "timeout"},
    ),
    # closes its stdout and stderr: results travel on their own pipe, both pass
    (
        "closes stdout early",
        "import os\nos.close(1)\nos.close(2)\ndef f():\n    return 1\n" + ONE,
        TWO_TESTS,
        1.0,
        {},
    ),
    # exits with status 0 before any test: no test passed, so none counts (never "all ok")
    (
        "os._exit(0) before the tests",
        "import os\n" + ONE + "def f():\n    return 1\nos._exit(0)\n",
        TWO_TESTS,
        0.0,
        {"0": "exited with status 0 before the tests ran"},
    ),
    (
        "sys.exit(0) before the tests",
        "import sys\n" + ONE + "def f():\n    return 1\nsys.exit(0)\n",
        TWO_TESTS,
        0.0,
        {"0": "SystemExit"},
    ),
    # writes pass lines onto its answer pipe: the checker reads values, not lines; junk
    # fails the tests
    (
        "forged results",
        "import os\nfor i in range(2):\n"
        "    os.write(3, f'S {i}\\nP {i}\\n0000000000000000 P {i} \\n'.encode())\n"
        "def f():\n    return 0\ndef g():\n    return 0\n",
        TWO_TESTS,
        0.0,
        {"0": "cannot be read", "1": "cannot be read"},
    ),
    # a segfault in one test: that test fails with the signal, the next runs in a new child
    (
        "segfault in one test",
        "import ctypes\ndef f(x):\n    if x == 2:\n        ctypes.string_at(0)\n    return x\n",
        "assert f(1) == 1\nassert f(2) == 2\nassert f(3) == 3\n",
        2 / 3,
        {"1": "SIGSEGV"},
    ),
    # raises in a test: that test fails with the exception
    (
        "exception",
        "def f():\n    raise ValueError('nope')\n" + ONE,
        TWO_TESTS,
        0.5,
        {"0": "ValueError: nope"},
    ),
    # does not compile: every test fails with the syntax error
    ("syntax error", "def f(:\n    return 1\n", TWO_TESTS, 0.0, {"0": "SyntaxError"}),
]


def run_case(sandbox: Sandbox, program: str, tests: str) -> dict[str, Any]:
    body = sandbox.score("code_tests", [group(tests, f"```python\n{program}```")])
    return dict(body["groups"][0])


@pytest.mark.parametrize(
    ("program", "tests", "score", "reasons"),
    [pytest.param(*c[1:], id=c[0]) for c in CORPUS],
)
def test_hostile_program_scores_as_specified(
    sandbox: Sandbox, program: str, tests: str, score: float, reasons: dict[str, str]
) -> None:
    g = run_case(sandbox, program, tests)
    assert g["errors"] == [], g  # the program's failures are never null
    assert g["scores"] == [pytest.approx(score)], g
    failed = g["info"]["failed"][0]
    assert set(failed) >= set(reasons), g
    for index, words in reasons.items():
        assert words in failed[index], (index, failed[index])
    assert httpx.get(f"{sandbox.url}/readyz", timeout=5).status_code == 200


def test_the_whole_corpus_at_once_leaves_the_service_healthy(sandbox: Sandbox) -> None:
    """All of it concurrently, twice over; then an honest program still scores 1."""
    cases = [c for c in CORPUS for _ in range(2)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda c: run_case(sandbox, c[1], c[2]), cases))
    for case, g in zip(cases, got, strict=True):
        assert g["scores"] == [pytest.approx(case[3])], (case[0], g)
    honest = problems("humaneval")[0]
    body = sandbox.score("code_tests", [group(honest["reference"], honest["correct"])])
    assert body["groups"][0]["scores"] == [1.0]
    ready = httpx.get(f"{sandbox.url}/readyz", timeout=5)
    assert ready.status_code == 200 and ready.json()["checks"]["sandbox"] == "ok"


def test_nothing_written_by_one_run_is_seen_by_the_next(sandbox: Sandbox) -> None:
    """Each run looks for the marker files earlier runs left, then leaves its own."""
    program = (
        "import glob\n"
        "def leftovers():\n"
        "    found = glob.glob('/tmp/*') + glob.glob('/tmp/.*')\n"
        "    open('/tmp/marker', 'w').write('x')\n"
        "    return [p for p in found if 'marker' in p]\n"
    )
    for _ in range(3):  # one after another: a reused sandbox would see the marker
        g = run_case(sandbox, program, "assert leftovers() == []\n")
        assert g["scores"] == [1.0], g


def test_the_services_files_environment_and_secret_are_out_of_reach(sandbox: Sandbox) -> None:
    program = f"""
import os
SECRET = {sandbox.secret!r}
def leaks():
    found = [k for k, v in os.environ.items() if SECRET in v or k.startswith(("GATEWAY", "SAND"))]
    paths = ({str(sandbox.secret_file)!r}, {str(REPO / "pyproject.toml")!r}, '/root', '/etc/passwd')
    for path in paths + ('/home', '/work', '/proc'):  # no /proc: no one's environ to read
        if os.path.exists(path):
            found.append(path)
    import importlib.util, site
    for name in ('arbiter', 'fastapi', 'pydantic'):  # the service's code and packages
        if importlib.util.find_spec(name) is not None:
            found.append(name)
    for d in site.getsitepackages():  # hidden: empty even if put back on sys.path
        if os.path.isdir(d) and os.listdir(d):
            found.append(d)
    return found
"""
    g = run_case(sandbox, program, "assert leaks() == []\n")
    assert g["scores"] == [1.0], g


def test_no_socket_reaches_the_host_or_the_outside(sandbox: Sandbox, redis_url: str) -> None:
    """Redis and the sandbox service itself listen on the host's 127.0.0.1; the sandbox's
    own network namespace has only its own loopback, where nothing listens."""
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    own_port = int(sandbox.url.rsplit(":", 1)[1])
    program = f"""
import socket
def reached():
    out = []
    for host, port in [('127.0.0.1', {redis_port}), ('127.0.0.1', {own_port}),
                       ('1.1.1.1', 53), ('10.0.0.1', 80)]:
        s = socket.socket()
        s.settimeout(0.5)
        try:
            s.connect((host, port))
            out.append((host, port))
        except OSError:
            pass
        finally:
            s.close()
    try:
        socket.getaddrinfo('example.com', 80)
        out.append('dns')
    except OSError:
        pass
    return out
"""
    g = run_case(sandbox, program, "assert reached() == []\n")
    assert g["scores"] == [1.0], g


def test_stdio_program_that_closes_stdout_after_answering_passes(sandbox: Sandbox) -> None:
    program = "import sys\nprint(int(input()) * 2)\nsys.stdout.close()\n"
    tests = '[{"input": "3\\n", "output": "6\\n"}]'
    g = run_case(sandbox, program, tests)
    assert g["scores"] == [1.0], g
