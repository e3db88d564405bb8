"""The header every result file in ``bench/results/`` carries, and the one way to write one.

A figure in the docs is traced to the run behind it by the file's ``"run"`` object:

- ``machine``: the card(s) when a GPU is visible, else the CPU and its core count;
- ``commit``: the checkout's commit (``+ uncommitted changes`` when tracked files differ);
  where the run has no git checkout (a copy of the tree on a GPU machine) the caller passes
  ``ARBITER_COMMIT=<hash>`` in the environment;
- ``command``: the command line that ran (``sys.orig_argv``, or the one given);
- ``date``: UTC, to the minute;
- ``versions``: Python and the installed key packages.

Benchmark scripts write their JSON with ``write_result(path, body)``, which puts the header
first and keeps the body's own keys as they were. A file that is not JSON (per-step metrics as
``.jsonl.gz``, a probe's text output) gets a sidecar ``<name>.run.json`` from
``write_sidecar``. ``tests/bench/test_results.py`` checks every file in ``bench/results/``.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FIELDS = ("machine", "commit", "command", "date", "versions")
SIDECAR = ".run.json"
# The packages whose versions move the numbers: the trainer's stack, the services' stack.
KEY_PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "sentence-transformers",
    "math-verify",
    "fastapi",
    "uvicorn",
    "httpx",
    "aiohttp",
    "redis",
)


def _cpu() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()}-core {model} ({platform.machine()}, {platform.system()})"


def machine() -> str:
    """The GPU(s) as ``nvidia-smi`` names them (``2 x NVIDIA H100 80GB HBM3``) and the CPU."""
    cards: list[str] = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
            cards = [x.strip() for x in out.splitlines() if x.strip()]
        except (OSError, subprocess.SubprocessError):
            cards = []
    cpu = _cpu()
    if not cards:
        return cpu
    names = sorted(set(cards))
    gpus = ", ".join(f"{cards.count(n)} x {n}" for n in names)
    return f"{gpus}; {cpu}"


def commit() -> str:
    """``git rev-parse HEAD`` of this checkout, or ``ARBITER_COMMIT`` where there is none."""
    given = os.environ.get("ARBITER_COMMIT", "").strip()
    if given:
        return given
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if head.returncode != 0:
            raise OSError(head.stderr.strip())
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git checkout here; pass ARBITER_COMMIT=<hash>)"
    return head.stdout.strip() + (" + uncommitted changes" if dirty else "")


def versions() -> dict[str, str]:
    """Python's version and each installed key package's (missing ones are left out)."""
    found = {"python": platform.python_version()}
    for name in KEY_PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    torch = sys.modules.get("torch")  # only when the benchmark imported it: no 2 s import here
    if torch is not None and getattr(torch.version, "cuda", None):
        found["cuda"] = str(torch.version.cuda)
    return found


def header(command: str | None = None, machine_name: str | None = None) -> dict[str, Any]:
    """The ``"run"`` object for a result written now by this process."""
    return {
        "machine": machine_name or machine(),
        "commit": commit(),
        "command": command or shlex.join(sys.orig_argv),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "versions": versions(),
    }


def with_header(
    body: dict[str, Any], command: str | None = None, machine_name: str | None = None
) -> dict[str, Any]:
    """``body`` with the header first (an existing ``"run"`` in ``body`` is kept as it is)."""
    if "run" in body:
        return body
    return {"run": header(command, machine_name), **body}


def write_result(
    path: Path,
    body: dict[str, Any],
    *,
    command: str | None = None,
    machine_name: str | None = None,
    indent: int = 1,
) -> dict[str, Any]:
    """Write ``body`` as JSON to ``path`` under the header; returns what was written."""
    out = with_header(body, command, machine_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=indent, default=str) + "\n")
    return out


def sidecar(path: Path) -> Path:
    """Where the header of a non-JSON result file lives: ``<name>.run.json`` beside it."""
    return path.with_name(path.name + SIDECAR)


def write_sidecar(
    path: Path, *, command: str | None = None, machine_name: str | None = None
) -> Path:
    """Write the header of ``path`` (a file that is not JSON) beside it."""
    side = sidecar(path)
    side.write_text(json.dumps({"run": header(command, machine_name)}, indent=1) + "\n")
    return side


def missing(run: Any) -> list[str]:
    """The header fields that ``run`` lacks or leaves empty (``[]`` for a whole header)."""
    if not isinstance(run, dict):
        return list(FIELDS)
    gaps = [f for f in FIELDS if not run.get(f)]
    vers = run.get("versions")
    if isinstance(vers, dict) and not all(str(v).strip() for v in vers.values()):
        gaps.append("versions (an empty value)")
    return gaps
