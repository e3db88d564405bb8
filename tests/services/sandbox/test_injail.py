"""The code that runs inside the sandbox (``services/sandbox/injail/``) keeps its rule:
standard library only, no import of the service; and the program the sandbox runs is
exactly that folder's modules joined (``bwrap.py``)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from arbiter.services.sandbox import bwrap

INJAIL = bwrap.INJAIL
MODULES = sorted(p for p in INJAIL.glob("*.py") if p.name != "__init__.py")
# Python 3.12's name for the builtin SHA-256 module (``_sha256`` before), which the 3.11
# running these tests does not list
STDLIB = sys.stdlib_module_names | {"_sha2"}
SIBLINGS = {f"arbiter.services.sandbox.injail.{p.stem}" for p in MODULES}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the module, those inside functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}:{node.lineno}: a relative import"
            found.append((node.lineno, node.module or ""))
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_module_in_the_jail_imports_the_standard_library_only(path: Path) -> None:
    outside = [
        f"{path.name}:{line}: {name}"
        for line, name in _imports(path)
        if name.split(".")[0] not in STDLIB and name not in SIBLINGS
    ]
    assert not outside, f"imports outside the standard library in the jail: {outside}"


def test_the_sandbox_runs_every_module_of_the_folder_and_no_other() -> None:
    assert sorted(bwrap.PARTS) == [p.stem for p in MODULES]
    program = ast.parse(bwrap.HARNESS)
    kept = {
        node.module
        for node in ast.walk(program)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    # the modules' imports of each other are dropped (one program, its names defined
    # above), and every __future__ import but the first module's, which opens the program
    assert not kept & SIBLINGS, kept
    assert bwrap.HARNESS.count("from __future__ import") == 1
    assert "def serve(" in bwrap.HARNESS and "def answer_job(" in bwrap.HARNESS
