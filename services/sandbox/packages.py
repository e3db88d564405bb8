"""The packages a ``python_grader`` may import, as OpenAI's Python graders offer them.

OpenAI's graders guide (https://developers.openai.com/api/docs/guides/graders, Python
graders) lists the third-party packages its grader image provides. The ones here are
installed by the ``graders`` extra at the versions ``requirements/constraints.txt`` pins, in
the service's own environment; a sandbox sees each of them and what it depends on (no other
package of the service) read-only under ``JAIL_SITE``, which a grader's job puts first on
``sys.path``. Left out, with the reason (``docs/services/sandbox.md`` lists them): ``rdkit``
and ``scikit-bio`` (with their dependencies h5py, statsmodels and formulaic, hundreds of MB
of native code for two domain libraries).

Native libraries start one thread per core unless told otherwise, and a sandbox allows a few
processes (threads count): ``THREAD_ENV`` keeps each at one.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

from arbiter.services.sandbox.settings import SandboxSettings

log = logging.getLogger("arbiter.sandbox")

# The distributions OpenAI's guide lists that the sandbox offers, by their PyPI names.
GRADER_DISTRIBUTIONS = (
    "numpy",
    "scipy",
    "sympy",
    "pandas",
    "rapidfuzz",
    "scikit-learn",
    "rouge-score",
    "deepdiff",
    "jsonschema",
    "pydantic",
    "pyyaml",
    "nltk",
    "sqlparse",
    "ast-grep-py",
)
LEFT_OUT = {
    "rdkit": "about 40 MB of native chemistry libraries",
    "scikit-bio": "pulls h5py, statsmodels and formulaic: hundreds of MB of native code",
}
JAIL_SITE = "/opt/arbiter/graders"  # where a sandbox sees them, read-only
THREAD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_MAX_THREADS": "1",
    "RAYON_NUM_THREADS": "1",
}
# their metadata (nothing imports it) and path hooks: fewer mounts each job's namespace copies
SKIP = (".dist-info", ".pth")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions ``names`` and everything they require (no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python: not installed here
        found[key] = dist
        for req in dist.requires or []:
            m = _NAME.match(req)
            if m and "extra ==" not in req.replace('"', "").replace("'", ""):
                todo.append(m.group(1))
    return list(found.values())


@cache
def grader_paths() -> tuple[Path, ...]:
    """The top-level files and folders of the graders' distributions and their
    dependencies: each package or module, and its ``*.libs`` folder of native libraries."""
    out: dict[Path, None] = {}
    for dist in _closure(GRADER_DISTRIBUTIONS):
        site = Path(str(dist.locate_file(""))).resolve()
        for file in dist.files or []:
            parts = Path(str(file)).parts
            if parts and parts[0] not in ("..", "__pycache__") and not parts[0].endswith(SKIP):
                path = site / parts[0]
                if path.exists():
                    out[path] = None
    return tuple(out)


def _cache_tag(python: str) -> str:
    code = "import sys; print(sys.implementation.cache_tag)"
    return subprocess.run(  # the configured interpreter, a fixed script
        [python, "-I", "-S", "-c", code], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def grader_binds(settings: SandboxSettings) -> list[str]:
    """bwrap arguments: every path of ``grader_paths`` read-only under ``JAIL_SITE``, and the
    thread settings; none of the binds when ``SANDBOX_GRADER_PACKAGES`` is off, or when the
    sandbox's interpreter is another Python (its native modules would not load: a grader's
    import fails as on a bare interpreter)."""
    argv: list[str] = []
    for key, value in THREAD_ENV.items():
        argv += ["--setenv", key, value]
    paths = grader_paths()
    if not paths or not settings.grader_packages:
        return argv
    theirs, ours = _cache_tag(settings.python), sys.implementation.cache_tag
    if theirs != ours:
        log.warning(
            "SANDBOX_PYTHON is %s, the service %s: graders cannot import the packages of the "
            "graders extra (point SANDBOX_PYTHON at the service's Python version)",
            theirs,
            ours,
        )
        return argv
    for path in paths:
        argv += ["--ro-bind", str(path), f"{JAIL_SITE}/{path.name}"]
    return argv
