"""Shared fixtures: real processes on free loopback ports, started once per session.

Services run exactly as in production (``arbiter serve NAME --port P``, in their own
process group); Redis is a real redis-server bound to 127.0.0.1. Fixtures that a test breaks on
purpose (stopping a service or Redis) are function-scoped and start their own copies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiter import gsm8k
from arbiter.procs import ManagedProcess, free_port, redis_process, service_process

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    # Offline, as CI runs (.ci/run exports the same): the test process and every service
    # it starts use only models already on disk.
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(name, "1")
    # torch's OpenMP threads spin up to 300,000 times at each barrier before they sleep. On
    # two cores, beside another busy process (a second torch process, a service, another
    # job on the machine) they spin away each other's time slices: 20 steps of the tiny
    # model took 46 s instead of 2 beside a second such process (1,000 spins: 3.7 s; alone,
    # 1.9 s either way), and regress.sh SMALL 399 s instead of 155 s beside two busy loops.
    # Set before any test imports torch; every process the tests start inherits it.
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    try:
        return gsm8k.require()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))


def _start(proc: ManagedProcess, timeout: float = 60.0) -> ManagedProcess:
    proc.start()
    try:
        proc.wait_ready(timeout)
    except Exception:
        proc.stop()
        raise
    return proc


def start_redis(log_dir: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = _start(redis_process(port, log_path=log_dir / f"redis-{port}.log"), 10.0)
    return proc, f"redis://127.0.0.1:{port}/0"


def start_service(
    name: str, log_dir: Path, env: dict[str, str] | None = None, timeout: float = 60.0
) -> tuple[ManagedProcess, str]:
    """Start ``arbiter serve <name>`` on a free port; return (process, base URL)."""
    port = free_port()
    proc = service_process(name, port, env=env, log_path=log_dir / f"{name}-{port}.log")
    _start(proc, timeout)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def redis_url(log_dir: Path) -> Iterator[str]:
    proc, url = start_redis(log_dir)
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def verify_url(log_dir: Path) -> Iterator[str]:
    proc, url = start_service("verify", log_dir, {"VERIFY_WORKERS": "2"})
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def gateway_url(log_dir: Path, verify_url: str, redis_url: str) -> Iterator[str]:
    """Gateway in front of the shared verify service and Redis (math + format recipes)."""
    proc, url = start_service(
        "gateway", log_dir, {"GATEWAY_VERIFY_URL": verify_url, "REDIS_URL": redis_url}
    )
    yield url
    proc.stop()
