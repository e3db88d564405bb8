"""A sandbox's memory limit bounds its processes together (``memory.py``).

A response whose program (or grader) starts as many processes as it may, each taking all
the memory it can, holds no more than its sandbox's limit in all: the resident memory of
every process of its sandbox, the zygote's included, measured from the host's ``/proc``
while they hold it. The program's own process then fails on memory, which fails its test
(a grader's: null ``grader_error``), and a response running beside it is unaffected.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from arbiter.services.sandbox.memory import process_mb
from arbiter.services.sandbox.settings import SandboxSettings
from tests.conftest import start_service
from tests.services.sandbox.conftest import ENV, group

SANDBOX_MB = 1536  # a code_tests sandbox: 135 MB each of 9 processes
GRADER_MB = 1536  # a python_grader's: 304 MB each of 4
SETTINGS = {
    **ENV,
    "SANDBOX_SPARE": "0",
    "SANDBOX_TMP_MB": "64",
    "SANDBOX_MEMORY_MB": str(SANDBOX_MB),
    "SANDBOX_GRADER_MEMORY_MB": str(GRADER_MB),
    "SANDBOX_GRADER_MAX_PROCESSES": "4",
    "SANDBOX_TEST_TIMEOUT_S": "5",
}

# each process takes memory 4 MB at a time, written, until it is refused, and holds it
HOG = """
import os, time

def grab():
    held = []
    try:
        while True:
            held.append(b'\\x01' * (4 << 20))
    except MemoryError:
        pass
    return held

def hog(forks):
    for _ in range(forks):
        try:
            if os.fork() == 0:
                held = grab()
                time.sleep(4)
                os._exit(0)
        except OSError:  # the process limit
            break
    held = grab()
    time.sleep(2.5)  # while every process of the sandbox holds its share
    held.append(b'\\x01' * (64 << 20))  # past its share: MemoryError
    return 1
"""


@pytest.fixture(scope="module")
def service(log_dir: Path) -> Iterator[tuple[str, int]]:
    proc, base = start_service("sandbox", log_dir, SETTINGS)
    assert proc.proc is not None
    yield base, proc.proc.pid
    proc.stop()


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _peak_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM), in KB; 0 once gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


class Watch:
    """Every process of each sandbox (a child of the service: ``setpriv``/``bwrap``, and
    everything under it), sampled until stopped: each process's peak resident memory.
    The sum of those peaks over a sandbox's processes bounds what they held at once."""

    def __init__(self, service_pid: int) -> None:
        self.root = service_pid
        self.peaks: dict[int, dict[int, int]] = {}  # sandbox -> process -> peak KB
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            parents = _parents()
            for box in [pid for pid, parent in parents.items() if parent == self.root]:
                tree, new = {box}, {box}
                while new:
                    new = {pid for pid, parent in parents.items() if parent in new} - tree
                    tree |= new
                seen = self.peaks.setdefault(box, {})
                for pid in tree:
                    seen[pid] = max(seen.get(pid, 0), _peak_kb(pid))
            time.sleep(0.02)

    def largest_mb(self) -> int:
        self.stop.set()
        self.thread.join()
        return max((sum(p.values()) >> 10 for p in self.peaks.values()), default=0)


def _post(url: str, component: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/{component}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()["groups"][0]
    return answer


def test_a_programs_processes_together_stay_within_the_sandboxs_memory(
    service: tuple[str, int],
) -> None:
    url, pid = service
    hog = {"groups": [group("assert hog(16) == 1\n", HOG)], "params": {}}
    plain = {"groups": [group("assert f() == 1\n", "def f():\n    return 1\n")], "params": {}}
    watch = Watch(pid)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        job = pool.submit(_post, url, "code_tests", hog)
        time.sleep(1.0)  # the hog's processes are taking memory: another response meanwhile
        beside = _post(url, "code_tests", plain)
        answer = job.result()
    largest = watch.largest_mb()
    print(f"largest sandbox: {largest} MB resident of its {SANDBOX_MB} MB")
    assert beside["scores"] == [1.0], beside
    assert answer["scores"] == [0.0], answer
    assert "MemoryError" in str(answer["info"]), answer
    assert largest <= SANDBOX_MB, f"one sandbox held {largest} MB"
    # the processes did take their shares: the program's 8 at least
    assert largest >= 8 * process_mb(SANDBOX_MB, 64, "tests", 8) * 0.8, largest


def test_a_graders_processes_together_stay_within_the_sandboxs_memory(
    service: tuple[str, int],
) -> None:
    url, pid = service
    source = HOG + "\ndef grade(sample, item):\n    return hog(16)\n"
    body = {"groups": [group("", "x")], "params": {"source": source, "timeout_s": 5}}
    watch = Watch(pid)
    answer = _post(url, "python_grader", body)
    largest = watch.largest_mb()
    print(f"largest grader sandbox: {largest} MB resident of its {GRADER_MB} MB")
    (error,) = answer["errors"]
    assert answer["scores"] == [None], answer
    assert error["kind"] == "grader_error" and "MemoryError" in error["message"], error
    assert largest <= GRADER_MB, f"one sandbox held {largest} MB"
    assert largest >= 4 * process_mb(GRADER_MB, 64, "grader", 4) * 0.8, largest


# (kind, sandbox MB, processes, each process's RLIMIT_AS): /tmp 64 MB, PID 1 256 MB
SHARES = [
    ("tests", 2560, 8, 248),  # the default: 8 of the program's and the checker
    ("stdio", 2560, 8, 280),  # no checker: the program's 8 alone
    ("grader", 4096, 2, 1888),  # a grader's default
    ("tests", 1536, 8, 135),  # this file's service
]


@pytest.mark.parametrize(("kind", "total", "processes", "each"), SHARES)
def test_the_shares_add_up_to_the_sandboxs_limit(
    kind: str, total: int, processes: int, each: int
) -> None:
    assert process_mb(total, 64, kind, processes) == each
    slots = processes + (kind == "tests")
    assert 64 + 256 + slots * each <= total < 64 + 256 + slots * (each + 1)


def test_a_limit_too_small_to_share_is_refused_naming_it() -> None:
    # 512 MB was the old per-process default: as a whole sandbox's it leaves 21 MB each
    with pytest.raises(ValidationError, match="SANDBOX_MEMORY_MB=512 leaves 21 MB"):
        SandboxSettings(memory_mb=512)
    with pytest.raises(ValidationError, match="SANDBOX_GRADER_MEMORY_MB=1024"):
        SandboxSettings(grader_memory_mb=1024, grader_max_processes=16)
