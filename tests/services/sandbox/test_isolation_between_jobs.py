"""Isolation between jobs: what a job can do to the sandbox that runs the jobs after it, to
the zygote itself, and to its own answer.

One sandbox (``SANDBOX_WORKERS=1``, no spare) runs every job, so a job that leaves
something behind meets the next one. Each test checks that an attack is refused;
the comment above a test says what the attack is.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from arbiter.services.sandbox.memory import HARNESS_MB
from tests.conftest import start_service
from tests.services.sandbox.conftest import ENV, group

MEMORY_MB = 128  # each process's share of the sandbox's memory
# /tmp, PID 1's own and 9 processes (the program's 8 and the checker): memory.py's sum
SANDBOX_MB = 64 + HARNESS_MB + 9 * MEMORY_MB
ONE_SANDBOX = {**ENV, "SANDBOX_WORKERS": "1", "SANDBOX_SPARE": "0"}
ONE_SANDBOX |= {"SANDBOX_MEMORY_MB": str(SANDBOX_MB), "SANDBOX_TMP_MB": "64"}
ONE_SANDBOX |= {"SANDBOX_TEST_TIMEOUT_S": "5", "SANDBOX_ITEM_TIMEOUT_S": "8"}


@pytest.fixture(scope="module")
def service(log_dir: Path) -> Iterator[tuple[str, int]]:
    proc, base = start_service("sandbox", log_dir, ONE_SANDBOX)
    assert proc.proc is not None
    yield base, proc.proc.pid
    proc.stop()


@pytest.fixture(scope="module")
def url(service: tuple[str, int]) -> str:
    return service[0]


def _largest_rss_mb(root: int) -> int:
    """The largest resident set among ``root``'s descendants (the sandboxes), in MB."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, new, largest = set(), {root}, 0
    while new:
        new = {pid for pid, parent in parents.items() if parent in new}
        tree |= new
    for pid in tree:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    largest = max(largest, int(line.split()[1]) >> 10)
    return largest


def _score(url: str, reference: str, program: str) -> dict:
    body = {"groups": [group(reference, program)], "params": {}}
    r = httpx.post(f"{url}/v1/code_tests", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer: dict = r.json()["groups"][0]
    return answer


def _settled(url: str) -> None:
    """The sandbox free again after what an earlier test left (a plain job waits for it)."""
    assert _score(url, "assert f() == 1\n", "def f():\n    return 1\n")["scores"] == [1.0]


def _metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


# A job's processes share the zygote's process group (bwrap --new-session made it, the
# job's PID 1 inherits it): kill(0, sig) from a process of the job reaches the zygote and
# the job's first fork, which are outside the job's PID namespace. The test's own process
# leaves that group first, so only a helper child dies with them.
SIGNAL_THE_GROUP = """
import os, signal, time
def f():
    if os.fork() == 0:
        time.sleep(0.2)
        os.kill(0, signal.{sig})
        os._exit(0)
    os.setsid()
    time.sleep({sleep})
    return 1
"""


# Was a finding (fixed): kill(0, SIGKILL) kills the job's first fork (the zygote's process group);
# the zygote writes '#exit' while the job's PID 1 still runs, takes the next job, and the next job
# (any team's) gets the first job's answer
def test_a_job_cannot_answer_for_the_next_job(url: str) -> None:
    attacker = _score(url, "assert f() == 1\n", SIGNAL_THE_GROUP.format(sig="SIGKILL", sleep=1.5))
    # a wrong program, sent next: its own answer comes after the attacker's (3 s vs 1.5 s)
    victim = _score(url, "assert g() == 1\n", "import time\ndef g():\n    time.sleep(3)\n")
    assert victim["scores"] == [0.0], victim  # it got 1.0: the attacker's answer
    assert attacker["scores"] == [1.0], attacker  # it got null: '#exit -9' read as its answer


# Was a finding (fixed): kill(0, SIGSTOP) stops the job's first fork; the zygote waits on it, its
# '#exit' never comes and the sandbox is killed 5 s (RETIRE_S) after the answer
def test_stopping_the_jobs_first_fork_does_not_cost_the_sandbox(url: str) -> None:
    _settled(url)
    started = _metric(url, "sandbox_started_total")
    exits = _metric(url, "sandbox_failures_total", '{stage="exit"}')
    body = _score(url, "assert f() == 1\n", SIGNAL_THE_GROUP.format(sig="SIGSTOP", sleep=0.5))
    assert body["scores"] == [1.0], body
    _settled(url)
    assert _metric(url, "sandbox_failures_total", '{stage="exit"}') == exits
    assert _metric(url, "sandbox_started_total") == started


# Was a finding (fixed): SIGINT keeps Python's handler in the zygote and the job's PID 1, so
# neither ignores it: a failing program's score becomes a null sandbox_error (masked in training);
# kill(0, SIGINT) also kills the zygote
@pytest.mark.parametrize("target", ["1", "0"], ids=["pid-1", "process-group"])
def test_sigint_cannot_turn_a_failure_into_a_sandbox_error(url: str, target: str) -> None:
    _settled(url)
    started = _metric(url, "sandbox_started_total")
    program = f"import os, signal, time\ndef f():\n    os.kill({target}, signal.SIGINT)\n"
    program += "    time.sleep(0.5)\n    return 0\n"
    body = _score(url, "assert f() == 1\n", program)
    assert body["scores"] == [0.0], body
    assert _metric(url, "sandbox_started_total") == started


# Was a finding (fixed): prlimit(1, ...) is allowed on PID 1 (same uid): a program lowers its
# runner's RLIMIT_NOFILE and crashes, PID 1 cannot open the next test's pipes and the failing
# response is null sandbox_error instead of 0
def test_a_program_cannot_set_its_runners_limits(url: str) -> None:
    program = (
        "import os, resource\ndef f(i):\n    if i == 0:\n"
        "        resource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3))\n        os._exit(1)\n"
    )
    body = _score(url, "assert f(0) == 1\nassert f(1) == 1\n", program)
    assert body["scores"] == [0.0], body


# Was a finding (fixed): a listening socket sent over a unix socket to itself (SCM_RIGHTS cycle)
# outlives the job's processes until the kernel's unix GC runs; the next job's connect to that port
# or abstract name succeeds on the shared loopback
def test_a_socket_kept_in_flight_does_not_outlive_its_job(url: str) -> None:
    leave = (
        "import socket\ndef f(port):\n    srv = socket.socket()\n"
        "    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    srv.bind(('127.0.0.1', port))\n    srv.listen()\n"
        "    u = socket.socket(socket.AF_UNIX)\n    u.bind(b'\\0hostile-%d' % port)\n"
        "    u.listen()\n    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "    socket.send_fds(a, [b'x'], [srv.fileno(), u.fileno(), a.fileno(), b.fileno()])\n"
        "    return 1\n"
    )
    find = (
        "import socket\ndef f(port):\n    s = socket.socket()\n"
        "    u = socket.socket(socket.AF_UNIX)\n"
        "    return [s.connect_ex(('127.0.0.1', port)), u.connect_ex(b'\\0hostile-%d' % port)]\n"
    )
    # the kernel's unix GC runs when any unix socket of the host closes: three tries
    for port in (47031, 47032, 47033):
        assert _score(url, f"assert f({port}) == 1\n", leave)["scores"] == [1.0]
        refused = f"r = f({port})\nassert r == [111, 111], r\n"  # ECONNREFUSED both
        body = _score(url, refused, find)
        assert body["scores"] == [1.0], body["info"]


# Was a finding (fixed): semget and msgget are allowed; System V semaphore arrays (2 MB of kernel
# memory per call) and message queues hold memory outside RLIMIT_AS and /tmp, as shmget did before
# seccomp refused it
def test_system_v_semaphores_and_queues_hold_no_memory_beyond_the_limit(url: str) -> None:
    program = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def sem_mb(n=0):\n"  # 32,000 semaphores of 64 bytes an array, zeroed at semget
        f"    while n < {MEMORY_MB} // 2 + 8 and libc.semget(0, 32000, 0o1600) >= 0:\n"
        "        n += 1\n    return 2 * n\n"
        "def msg_mb(n=0):\n    buf = ctypes.create_string_buffer(8 + 8192)\n"
        "    ctypes.c_long.from_buffer(buf).value = 1\n"
        f"    while n < {MEMORY_MB} * 64 + 256:\n"  # 16 KB a queue: two messages of 8 KB
        "        q = libc.msgget(0, 0o1600)\n"
        "        send = lambda: libc.msgsnd(q, buf, 8192, 0o4000)\n"  # IPC_NOWAIT
        "        if q < 0 or send() or send():\n"
        "            break\n        n += 1\n    return n // 64\n"
    )
    reference = (
        f"r = sem_mb()\nassert r < {MEMORY_MB}, r\nr = msg_mb()\nassert r < {MEMORY_MB}, r\n"
    )
    body = _score(url, reference, program)
    assert body["scores"] == [1.0], body["info"]


def test_a_job_cannot_regain_capabilities_or_leave_its_namespaces(url: str) -> None:
    program = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def e(r):
    return -ctypes.get_errno() if r == -1 else r
def f():
    hdr, caps = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    libc.capget(hdr, caps)
    admin = (ctypes.c_uint32 * 6)(1 << 21, 1 << 21, 0, 0, 0, 0)
    return [list(caps), e(libc.capset(hdr, admin)), e(libc.prctl(47, 2, 21, 0, 0)),
            libc.prctl(39, 0, 0, 0, 0), e(libc.unshare(0x10000000)),
            e(libc.unshare(0x40000000 | 0x04000000 | 0x02000000 | 0x20000000)),
            e(libc.setns(os.pidfd_open(1), 0x20000)),
            e(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)), e(libc.chroot(b'/tmp')),
            e(libc.sethostname(b'x', 1)), e(libc.fanotify_init(0, 0)),
            e(libc.open(b'/dev/shm/x', 0o101, 0o600))]
"""
    # no capability and none to add (capset, ambient raise: EPERM); no_new_privs set (no
    # setuid or file capability by exec); no user namespace (ENOSPC: --disable-userns); no
    # net, UTS, cgroup or PID namespace, setns, mount, chroot, sethostname (the UTS namespace
    # is the zygote's, shared by its jobs) or fanotify (EPERM); /dev/shm read-only (EROFS)
    want = [[0] * 6, -1, -1, 1, -28, -1, -1, -1, -1, -1, -1, -30]
    body = _score(url, f"r = f()\nassert r == {want!r}, r\n", program)
    assert body["scores"] == [1.0], body["info"]


def test_the_program_holds_no_descriptor_of_its_runner_or_the_zygote(url: str) -> None:
    # fd 1 of the job's PID 1 is the zygote's stdout (the answers' pipe): the program's fds
    # are its own stdin, its stdout (/dev/null: what it prints is dropped) and three pipes
    # of its own (stderr, its answers to the checker, the checker's requests), nothing else
    program = (
        "import os, stat\ndef f():\n    out = []\n    for fd in range(4096):\n"
        "        try:\n            out.append((fd, stat.S_ISFIFO(os.fstat(fd).st_mode)))\n"
        "        except OSError:\n            pass\n    return out\n"
    )
    want = [(0, False), (1, False), (2, True), (3, True), (4, True)]
    body = _score(url, f"r = f()\nassert r == {want!r}, r\n", program)
    assert body["scores"] == [1.0], body["info"]


def test_the_process_limit_counts_the_programs_processes_only(url: str) -> None:
    # RLIMIT_NPROC is SANDBOX_MAX_PROCESSES (8) plus the zygote, the job's first fork and
    # its PID 1: the program itself and 7 forks, then no thread either
    program = (
        "import os, threading, time\ndef f(n=1):\n    while n < 40:\n        try:\n"
        "            pid = os.fork()\n        except OSError:\n            break\n"
        "        if pid == 0:\n            time.sleep(20)\n        n += 1\n    try:\n"
        "        threading.Thread(target=time.sleep, args=(1,)).start()\n"
        "    except RuntimeError:\n        return n, None\n"
    )
    body = _score(url, "r = f()\nassert r == (8, None), r\n", program)
    assert body["scores"] == [1.0], body["info"]


# Was a finding (fixed): after a child ends, PID 1 drains its result pipe until it is empty and
# keeps every frame with the nonce (found in memory) unread; a grandchild that keeps the pipe full
# holds PID 1 there, past the test's timeout, and its memory (no RLIMIT_AS) grows without bound
# (~190 MB/s here) until the service's backstop
def test_result_frames_cannot_grow_the_runners_memory(service: tuple[str, int]) -> None:
    url, pid = service
    program = """
import fcntl, gc, os
def f():
    say = [o for o in gc.get_objects() if callable(o) and getattr(o, '__name__', '') == 'say']
    tag = [c.cell_contents for c in say[0].__closure__ if isinstance(c.cell_contents, str)][0]
    fcntl.fcntl(3, 1031, 1 << 20)  # F_SETPIPE_SZ: 1 MB
    chunk = f'{tag} S 0\\n'.encode() * 4096
    for _ in range(4):  # writers enough that PID 1 never finds it empty
        if os.fork() == 0:
            for _ in range(250):  # 1 million frames each, 19 MB
                os.write(3, chunk)
            os._exit(0)
    os._exit(0)
"""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        job = pool.submit(_score, url, "assert f() == 1\n", program)
        largest = 0
        while not job.done():
            largest = max(largest, _largest_rss_mb(pid))
            time.sleep(0.05)
    assert job.result()["scores"] == [0.0]
    assert largest < HARNESS_MB, f"a process of the sandbox held {largest} MB"


# Was a finding (fixed): a stdio program that fills /tmp leaves PID 1 no room for the next test's
# input (after an empty input, or any smaller one): PID 1 dies on ENOSPC and the failing response
# is null sandbox_error
def test_a_full_tmp_fails_the_next_stdio_test_not_the_sandbox(url: str) -> None:
    program = """
import sys
def fill(size, n=0):
    while True:
        try:
            with open(f'/tmp/{size}-{n}', 'wb') as f:
                f.write(b'x' * size)
        except OSError as exc:
            if exc.errno == 28:  # ENOSPC
                return
        n += 1
if not sys.stdin.read():
    for size in (8 << 20, 1 << 20, 4096, 0):
        fill(size)
print(0)
"""
    reference = json.dumps([{"input": "", "output": "1"}, {"input": "2\n", "output": "1"}])
    body = _score(url, reference, program)
    assert body["scores"] == [0.0], body
