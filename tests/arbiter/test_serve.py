"""``arbiter serve NAME``: real processes, settings from the environment, flags override,
one log line per record with the service name, at the level the settings give."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from arbiter.procs import ManagedProcess, free_port, service_process
from arbiter.serve import SERVICES, default_port
from arbiter.services.common.logs import LineFormatter

# <UTC time> <service> <LEVEL> <logger>: <message>
LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (?P<service>\w+) "
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<logger>[\w.]+): (?P<message>.*)$"
)


def _serve(argv: list[str], env: dict[str, str], log_path: Path, port: int) -> ManagedProcess:
    proc = ManagedProcess(
        name="serve",
        argv=[sys.executable, "-m", "arbiter.cli", "serve", *argv],
        env=env,
        ready_url=f"http://127.0.0.1:{port}/healthz",
        log_path=log_path,
        port=port,
    )
    proc.start()
    try:
        proc.wait_ready(60)
    except Exception:
        proc.stop()
        raise
    return proc


def _lines(path: Path) -> list[re.Match[str]]:
    text = path.read_text()
    matches = [LINE.match(line) for line in text.splitlines() if line]
    assert all(matches), f"lines not in the one format:\n{text}"
    return [m for m in matches if m]


@pytest.mark.parametrize(
    ("service", "env"),
    [
        ("gateway", {}),  # no component URLs needed to answer /healthz
        ("verify", {"VERIFY_WORKERS": "1"}),
        # the embedding model loads in the background: /healthz answers before it is ready
        ("embedding", {"EMBEDDING_DEVICE": "cpu"}),
        ("judge", {}),  # the judge server is only contacted by /readyz and requests
    ],
)
def test_each_service_serves_on_the_port_its_settings_give(
    service: str, env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    prefix = service.upper()
    log = tmp_path / f"{service}.log"
    proc = _serve([service], {**env, f"{prefix}_PORT": str(port)}, log, port)
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert r.status_code == 200 and r.json() == {"status": "ok"}
    finally:
        proc.stop()
    assert {m["service"] for m in _lines(log)} == {service}


def test_flags_override_settings_and_the_level_filters(tmp_path: Path) -> None:
    # VERIFY_PORT names a port the flag overrides; at warning level the start-up info
    # lines (uvicorn's and the service's own) are not written.
    port, ignored = free_port(), free_port()
    log = tmp_path / "verify.log"
    env = {"VERIFY_PORT": str(ignored), "VERIFY_LOG_LEVEL": "warning", "VERIFY_WORKERS": "1"}
    proc = _serve(["verify", "--port", str(port), "--host", "127.0.0.1"], env, log, port)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{ignored}/healthz", timeout=2)
    finally:
        proc.stop()
    assert all(m["level"] in ("WARNING", "ERROR", "CRITICAL") for m in _lines(log))


def test_debug_level_and_access_log(tmp_path: Path) -> None:
    # debug shows the service's own info lines and uvicorn's; VERIFY_ACCESS_LOG adds one
    # line per request. (Off by default: per-request lines cost CPU at high rates.)
    port = free_port()
    log = tmp_path / "verify.log"
    env = {"VERIFY_LOG_LEVEL": "debug", "VERIFY_ACCESS_LOG": "true", "VERIFY_WORKERS": "1"}
    proc = _serve(["verify", "--port", str(port)], env, log, port)
    try:
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        proc.stop()
    lines = _lines(log)
    loggers = {m["logger"] for m in lines}
    assert {"arbiter.verify", "uvicorn.error", "uvicorn.access"} <= loggers, loggers
    assert any('"GET /healthz HTTP/1.1" 200' in m["message"] for m in lines)


def test_service_process_defaults_to_the_settings_port() -> None:
    # procs (arbiter up, the tests) take the port from the settings, not from a copy.
    for name in SERVICES:
        proc = service_process(name)
        assert proc.port == default_port(name)
        assert proc.argv[-4:] == ["serve", name, "--port", str(default_port(name))]
    assert {n: default_port(n) for n in SERVICES} == {
        "gateway": 8000, "verify": 8001, "embedding": 8002, "judge": 8003,
    }  # fmt: skip


def test_bad_settings_exit_before_start_naming_the_variable(tmp_path: Path) -> None:
    env = {"VERIFY_LOG_LEVEL": "loud"}
    done = subprocess.run(
        [sys.executable, "-m", "arbiter.cli", "serve", "verify", "--port", str(free_port())],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "invalid settings" in done.stderr and "VERIFY_LOG_LEVEL: " in done.stderr


def test_a_traceback_stays_on_one_line() -> None:
    formatter = LineFormatter("gateway")
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.LogRecord("arbiter.x", logging.ERROR, __file__, 1, "failed", None, None)
        record.exc_info = sys.exc_info()
    line = formatter.format(record)
    assert "\n" not in line and "ValueError: boom\\nsecond line" in line
    match = LINE.match(line)
    assert match and match["service"] == "gateway" and match["logger"] == "arbiter.x"
