"""Verdicts the host's load cannot change: a correct program needing ~1 s of CPU scores
the same alone and beside another team's CPU flood (or null ``timeout``, retryable, never
0), and a program that sleeps fails its test rather than being judged starved."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_service
from tests.services.sandbox.conftest import ENV, Sandbox, group

PLUS_ONE = "assert f(1) == 2\nassert f(2) == 3\n"


def test_a_sleeper_fails_and_is_not_null(sandbox: Sandbox) -> None:
    sleeper = "import time\ndef f(x):\n    if x == 2:\n        time.sleep(60)\n    return x + 1\n"
    g = sandbox.score("code_tests", [group(PLUS_ONE, sleeper)])["groups"][0]
    assert g["scores"] == [0.5], g


# ~1 s of CPU on one core of the machine that wrote it; a test's limit here is 4 s of CPU
WORK = "def work(n):\n    return sum(i * i % 7 for i in range(n))\n"
N = 10_000_000


@pytest.fixture(scope="module")
def roomy(log_dir: Path) -> Iterator[Sandbox]:
    env = {**ENV, "SANDBOX_TEST_TIMEOUT_S": "4", "SANDBOX_ITEM_TIMEOUT_S": "30"}
    proc, url = start_service("sandbox", log_dir, env)
    yield Sandbox(url, "", Path("/nonexistent"))
    proc.stop()


def test_a_correct_program_scores_the_same_beside_a_cpu_flood(roomy: Sandbox) -> None:
    reference = f"assert work({N}) == {sum(i * i % 7 for i in range(N))}\n"
    params = {"timeout_s": 4}
    alone = roomy.score("code_tests", [group(reference, WORK)], params)["groups"][0]
    assert alone["scores"] == [1.0], alone
    # another team's programs: more spinning processes than the host has cores
    flood = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        beside = roomy.score("code_tests", [group(reference, WORK, WORK, WORK)], params)
    finally:
        for p in flood:
            p.kill()
            p.wait()
    g = beside["groups"][0]
    # the same score, or a null timeout (retryable) when the host starved it: never 0
    assert all(score in (1.0, None) for score in g["scores"]), g
    assert all(e["kind"] == "timeout" for e in g["errors"]), g
