"""Finding the validators the deploy tests run; a missing one fails the test with how to
install it (nothing is skipped, in CI or anywhere else)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.deployfiles import REPO

INSTALL = {
    "docker-compose": "apt-get install -y --no-install-recommends docker-compose "
    "(Debian's 1.29; `make setup` installs it)",
    "check-jsonschema": "pip install check-jsonschema (in the dev extra: pip install -e '.[dev]')",
    "kubernetes-validate": "pip install kubernetes-validate "
    "(in the dev extra: pip install -e '.[dev]')",
    "kubectl": "make kubectl (kubectl with kustomize built in, into .venv/bin; `make test` "
    "does this)",
}


def tool(name: str) -> str:
    """Path of a command: beside this Python first (the venv), then on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; install it with: {INSTALL[name]}")
    return found


def run(cmd: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """Run a validator; fail with its own output when it rejects the input."""
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.fail(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout.strip()}\n{proc.stderr.strip()}"
        )
    return proc
