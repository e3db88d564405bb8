"""What the regression checks' tests share: one SMALL run of a check's script on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]


@dataclass
class SmallRun:
    stdout: str  # the table among the parts' lines
    figures: dict[str, Any]  # <out>/<check>.json's figures
    out: Path  # the parts' outputs
    recorded: dict[str, Any]  # what --record wrote


@pytest.fixture
def small_run(tmp_path: Path) -> Callable[[str], SmallRun]:
    """``bash bench/device/<check>.sh`` with SMALL=1 (every part on the CPU, tiny sizes) and
    ``--record``; fails the test unless it exits 0."""

    def run(check: str) -> SmallRun:
        out, recorded = tmp_path / "out", tmp_path / "recorded.json"
        env = os.environ | {"SMALL": "1", "PY": sys.executable, "OUT": str(out), "LIMIT": "840"}
        proc = subprocess.run(
            ["bash", f"bench/device/{check}.sh", "--work", str(tmp_path / "work"),
             "--record", str(recorded)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        figures = json.loads((out / f"{check}.json").read_text())["figures"]
        return SmallRun(proc.stdout, figures, out, json.loads(recorded.read_text()))

    return run
