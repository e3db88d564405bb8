"""Where GSM8K is read from when no folder is given: one answer for the trainer, ``arbiter up``,
the tiny test model, the tests and the benchmarks.

``$ARBITER_GSM8K_DIR`` when set; else ``../shared/data/gsm8k`` beside the checkout Arbiter runs
from (an editable install or ``PYTHONPATH``). Installed from a wheel there is no checkout to
stand beside: the default is then ``../shared/data/gsm8k`` from the current directory, the
relative path the example configs use, and the error says to set the variable.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "ARBITER_GSM8K_DIR"
BESIDE = Path("..", "shared", "data", "gsm8k")  # relative to the checkout (or, installed, the cwd)


def checkout() -> Path | None:
    """The repository checkout this package runs from, or None when it is installed from a wheel
    (site-packages holds no ``pyproject.toml`` beside ``arbiter/``)."""
    root = Path(__file__).absolute().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "services").is_dir() else None


def default_dir() -> Path:
    """The default GSM8K folder (it may not exist: :func:`require` says what to do then)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    root = checkout()
    return (root / BESIDE).resolve() if root is not None else BESIDE


def missing(path: Path, flag: str = "") -> str:
    """What to do when ``path`` holds no GSM8K ``train.jsonl``/``test.jsonl``."""
    given = f" or pass {flag}" if flag else ""
    if checkout() is not None:
        where = "beside this checkout"
    else:  # installed from a wheel
        where = "from the current directory (installed from a wheel, no checkout to look beside)"
    if os.environ.get(ENV) and Path(os.environ[ENV]) == Path(path):
        return (
            f"GSM8K not found at {path} (no test.jsonl): {ENV} must name the folder with "
            f"train.jsonl and test.jsonl"
        )
    return (
        f"GSM8K not found at {path} (no test.jsonl): set {ENV} to the folder with "
        f"train.jsonl and test.jsonl{given}; the default is {BESIDE} {where}"
    )


def require(path: Path | None = None, flag: str = "") -> Path:
    """``path`` (default: :func:`default_dir`) if it holds GSM8K's ``test.jsonl``, else
    FileNotFoundError with :func:`missing`'s message."""
    path = default_dir() if path is None else Path(path)
    if not (path / "test.jsonl").is_file():
        raise FileNotFoundError(missing(path, flag))
    return path
