"""A test's limit is CPU time, so the host's load cannot decide a verdict: a correct program
that needs ~1 s of CPU scores 1.0 alone and beside a CPU flood (or, when the flood starves it
past the wall-clock backstop, null ``timeout``: retryable, never 0.0); a program that loops
or sleeps fails as before.

Its own service: 2 s of CPU a test (a backstop of 21 s of wall clock), 40 s a response,
the programs at the niceness of the flood (conftest: the test host is shared).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_service
from tests.services.sandbox.conftest import ENV, group

LIMITS = {**ENV, "SANDBOX_TEST_TIMEOUT_S": "2", "SANDBOX_ITEM_TIMEOUT_S": "40"}
# ~1 s of CPU in CPython on this class of machine, then the right answer
WORK = (
    "def f(x):\n    n = 0\n    for i in range(6_000_000):\n        n += i & 1\n    return x + 1\n"
)
STDIO_WORK = "n = 0\nfor i in range(6_000_000):\n    n += i & 1\nprint(int(input()) + 1)\n"
FLOOD = "while True:\n    pass\n"


@pytest.fixture(scope="module")
def url(log_dir: Path) -> Iterator[str]:
    proc, base = start_service("sandbox", log_dir, LIMITS)
    yield base
    proc.stop()


def _one(url: str, reference: str, program: str) -> dict[str, Any]:
    body = {"groups": [group(reference, program)], "params": {}}
    r = httpx.post(f"{url}/v1/code_tests", json=body, timeout=120)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["groups"][0]
    return result


def _flood(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` busy loops at niceness 0, as another team's programs on a shared host."""
    return [subprocess.Popen([sys.executable, "-c", FLOOD]) for _ in range(n)]


def test_a_correct_program_needing_a_second_of_cpu_passes_alone(url: str) -> None:
    g = _one(url, "assert f(1) == 2\n", WORK)
    assert g["scores"] == [1.0], g
    g = _one(url, json.dumps([{"input": "1\n", "output": "2\n"}]), STDIO_WORK)
    assert g["scores"] == [1.0], g


def test_beside_a_cpu_flood_it_is_never_a_failure(url: str) -> None:
    flood = _flood(6)
    try:
        for reference, program in [
            ("assert f(1) == 2\n", WORK),
            (json.dumps([{"input": "1\n", "output": "2\n"}]), STDIO_WORK),
        ]:
            g = _one(url, reference, program)
            if g["scores"] != [1.0]:  # starved past the backstop: retryable, not scored
                assert g["scores"] == [None], g
                assert g["errors"][0]["kind"] == "timeout", g
    finally:
        for p in flood:
            p.kill()
            p.wait()


def test_a_loop_fails_on_its_cpu_time_and_a_sleep_on_the_backstop(url: str) -> None:
    loop = "def f(x):\n    while x == 2:\n        pass\n    return x\n"
    g = _one(url, "assert f(1) == 1\nassert f(2) == 2\n", loop)
    assert g["scores"] == [0.5], g
    assert "timeout (2s of CPU)" in g["info"]["failed"][0]["1"], g
    sleep = "import time\ndef f(x):\n    if x == 2:\n        time.sleep(60)\n    return x\n"
    g = _one(url, "assert f(1) == 1\nassert f(2) == 2\n", sleep)
    assert g["scores"] == [0.5], g
    assert "slept or waited" in g["info"]["failed"][0]["1"], g
