"""Verify instances shared by this package's tests (real uvicorn on free loopback ports).

``strict_service``: a 2 s deadline with math-verify's own timeout set above it (so the
wall-clock kill-and-replace path is what answers), the numeric fast path off (every item
goes through the pool and math-verify) and a small item limit: the deadline, fairness and
cancellation tests. The shared default instance is ``verify_url`` (tests/conftest.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from arbiter.procs import ManagedProcess
from tests.conftest import start_service

DEADLINE_S = 2.0
MARGIN_S = 4.0  # process kill + replacement + HTTP, on a loaded 2-core machine
# An item that holds a worker for its whole deadline: math-verify evaluates 7^123456789.
STUCK = "\\boxed{7^{123456789}}"


@pytest.fixture(scope="package")
def strict_service(log_dir: Path) -> Iterator[tuple[ManagedProcess, str]]:
    proc, url = start_service(
        "verify",
        log_dir,
        {
            "VERIFY_WORKERS": "2",
            "VERIFY_DEADLINE_S": str(DEADLINE_S),
            "VERIFY_MATH_VERIFY_TIMEOUT_S": "30",
            "VERIFY_FAST_PATH": "false",
            "VERIFY_MAX_ITEMS": "64",
        },
    )
    yield proc, url
    proc.stop()


@pytest.fixture(scope="package")
def strict_url(strict_service: tuple[ManagedProcess, str]) -> str:
    return strict_service[1]


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples at ``url`` whose labels include ``labels``."""
    text = httpx.get(f"{url}/metrics").text
    total = 0.0
    for m in re.finditer(rf"^{name}(?:{{(.*)}})? (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total
