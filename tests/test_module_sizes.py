"""Every Python module in the repository stays under 400 lines (STYLE.md): past that, a
module holds more than one responsibility and is split by them, not cut in half."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT = 400


def test_every_module_is_under_400_lines() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked, "no Python file found: not a git checkout?"
    sizes = {path: len((REPO / path).read_text().splitlines()) for path in tracked}
    over = {path: n for path, n in sizes.items() if n >= LIMIT}
    assert not over, f"modules of {LIMIT} lines or more: {over}"
