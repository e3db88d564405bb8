"""``arbiter up`` starts the real stack, scores GSM8K samples, and leaves nothing running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arbiter.procs import free_port

ORS_PYTHON = os.environ.get("ARBITER_ORS_PYTHON", "")  # make ors-clients; CI sets it
ORS_CLIENTS = Path(__file__).parents[1] / "services" / "gateway" / "ors_clients.py"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _up_argv(tmp_path: Path, gsm8k_dir: Path, *extra: str) -> tuple[list[str], list[int]]:
    """argv and ports: gateway, verify, embedding, redis, sandbox, state redis, envs."""
    ports = [free_port() for _ in range(7)]
    argv = [
        sys.executable, "-m", "arbiter.cli", "up",
        "--gateway-port", str(ports[0]), "--verify-port", str(ports[1]),
        "--embedding-port", str(ports[2]), "--redis-port", str(ports[3]),
        "--sandbox-port", str(ports[4]), "--state-redis-port", str(ports[5]),
        "--envs-port", str(ports[6]),
        "--data", str(gsm8k_dir), "--samples", "2", "--logs", str(tmp_path / "logs"), *extra,
    ]  # fmt: skip
    return argv, ports


def _recipes(stdout: str) -> tuple[set[str], set[str]]:
    """(recipes served, recipes not configured) as `arbiter up` lists them."""
    lines = stdout.splitlines()
    served = next(ln for ln in lines if ln.startswith("  recipes "))
    off = next((ln for ln in lines if "not configured here:" in ln), ": ")
    return set(served.split(None, 1)[1].split(", ")), set(off.split(": ", 1)[1].split(", "))


def test_up_once_scores_samples_and_stops_everything(tmp_path: Path, gsm8k_dir: Path) -> None:
    argv, ports = _up_argv(tmp_path, gsm8k_dir, "--once")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # The sample table: a correct, formatted response scores math 1.0 and format 1.0.
    assert "recipe gsm8k-diverse" in done.stdout
    assert "math_accuracy=1.000" in done.stdout and "format=1.000" in done.stdout
    assert "Arbiter is up" in done.stdout
    # the sandbox started, and the gateway serves the code recipes with it
    served, off = _recipes(done.stdout)
    assert {"code", "code-all", "gsm8k"} <= served and not {"code", "code-all"} & off, done.stdout
    assert not any(_listening(p) for p in ports), "a child process outlived `arbiter up`"
    # each service ran as `arbiter serve NAME`: its log lines carry its name
    for name in ("verify", "embedding", "sandbox", "envs", "gateway"):
        log = (tmp_path / "logs" / f"{name}.log").read_text()
        assert f"Z {name} INFO uvicorn.error: Application startup complete." in log, log


def test_up_serves_the_ors_clients_and_stops_every_child_on_sigterm(
    tmp_path: Path, gsm8k_dir: Path
) -> None:
    argv, ports = _up_argv(tmp_path, gsm8k_dir, "--no-embedding")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 240
    for line in proc.stdout:
        lines.append(line)
        if "Ctrl-C stops everything" in line or time.monotonic() > deadline:
            break
    assert any("Arbiter is up" in line for line in lines), "".join(lines)
    live = [p for i, p in enumerate(ports) if i != 2 and _listening(p)]
    assert len(live) == 6  # gateway, verify, redis, sandbox, state redis, envs (no embedding)
    if ORS_PYTHON:  # the field's ORS clients run every environment against it, unmodified
        gateway = f"http://127.0.0.1:{ports[0]}"
        for client in ("ors-sdk", "openreward"):
            run = subprocess.run(
                [ORS_PYTHON, str(ORS_CLIENTS), client, gateway],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    time.sleep(0.5)
    assert not any(_listening(p) for p in ports), "a child process outlived SIGTERM"


def _free_run(n: int) -> int:
    """A port N with N..N+n-1 all free (for --port-base)."""
    for _ in range(50):
        base = free_port()
        if base + n <= 65535 and not any(_listening(base + i) for i in range(n)):
            return base
    raise RuntimeError("no run of free ports")


def test_port_base_moves_every_process_and_prints_arbiter_url(
    tmp_path: Path, gsm8k_dir: Path
) -> None:
    base = _free_run(8)
    argv = [
        sys.executable, "-m", "arbiter.cli", "up", "--once", "--no-embedding", "--no-sandbox",
        "--verify-port", str(_free_run(1)),  # a single flag still wins over the base
        "--data", str(gsm8k_dir), "--samples", "1", "--logs", str(tmp_path / "logs"),
    ]  # fmt: skip
    env = {**os.environ, "ARBITER_PORT_BASE": str(base)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"  gateway    http://127.0.0.1:{base} " in out, out
    assert f"  envs       http://127.0.0.1:{base + 5} " in out, out
    assert f"  redis      redis://127.0.0.1:{base + 6} " in out, out
    assert f"  state-redis redis://127.0.0.1:{base + 7} " in out, out
    assert f"  verify     http://127.0.0.1:{base + 1} " not in out, out  # its flag won
    assert f"  export ARBITER_URL=http://127.0.0.1:{base}\n" in out, out
    assert "math_accuracy=1.000" in out


@pytest.mark.parametrize("busy_index", [0])
def test_up_refuses_busy_ports(tmp_path: Path, gsm8k_dir: Path, busy_index: int) -> None:
    argv, ports = _up_argv(tmp_path, gsm8k_dir, "--once")
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[busy_index]))
        s.listen()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "ports in use" in done.stderr


@pytest.mark.parametrize(
    ("bwrap", "says"),
    [
        # no bubblewrap on the machine: not started, one line says how to install it
        (
            "/nonexistent/bwrap",
            "sandbox not started (/nonexistent/bwrap not found; Debian: "
            "apt-get install bubblewrap)",
        ),
        # a bwrap that cannot make a sandbox (here: one that exits at once, as bwrap does
        # where user namespaces are refused): started, not ready, stopped, left out
        ("/bin/false", "sandbox did not start"),
    ],
    ids=["no-bwrap", "sandbox-fails"],
)
def test_up_runs_without_the_sandbox_and_says_so(
    tmp_path: Path, gsm8k_dir: Path, bwrap: str, says: str
) -> None:
    argv, ports = _up_argv(tmp_path, gsm8k_dir, "--once", "--no-embedding")
    env = {**os.environ, "SANDBOX_BWRAP": bwrap}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    # one line, saying why and what that means
    notes = [ln for ln in done.stderr.splitlines() if "recipes code and code-all" in ln]
    assert len(notes) == 1 and says in notes[0], done.stderr
    assert "  sandbox    not started" in done.stdout, done.stdout
    # the gateway has no sandbox: it lists the code recipes as not configured, math as served
    served, off = _recipes(done.stdout)
    assert {"code", "code-all"} <= off and "gsm8k" in served, done.stdout
    assert "math_accuracy=1.000" in done.stdout
    assert not any(_listening(p) for p in ports), "a child process outlived `arbiter up`"
