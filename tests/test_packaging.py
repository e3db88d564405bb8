"""What `pip install arbiter-rewards` puts into a user's environment.

The repository keeps services/, trainer/ and proto/ at its top level; installed, they
must live under the one import name ``arbiter`` so that a user's own ``trainer.py`` or
``services`` package cannot shadow ours (or be shadowed by ours). The client and the
framework adapters must import with the base dependencies only.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Imported by the service and trainer extras only; the client must not need them.
EXTRAS_ONLY = ["fastapi", "uvicorn", "starlette", "redis", "torch", "transformers",
               "sentence_transformers", "math_verify", "prometheus_client", "aiohttp",
               "numpy"]  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (whl,) = out.glob("arbiter_rewards-*.whl")
    return whl


def test_wheel_has_one_top_level_import_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"arbiter"}
    # The mapped folders are real files inside the wheel, not links to the checkout.
    for module in ("arbiter/services/gateway/app.py", "arbiter/trainer/loop.py",
                   "arbiter/proto/gateway.py", "arbiter/proto/openapi/gateway.json"):  # fmt: skip
        assert module in names, module


def test_client_imports_without_service_or_trainer_extras() -> None:
    # Block the extras' packages as if they were not installed, then import the client.
    blocked = ", ".join(repr(m) for m in EXTRAS_ONLY)
    code = (
        "import sys\n"
        f"for m in ({blocked},): sys.modules[m] = None\n"
        "import arbiter.client, arbiter.errors, arbiter.proto.gateway\n"
        "import importlib, pkgutil, arbiter\n"
        "integrations = importlib.util.find_spec('arbiter.integrations')\n"
        "if integrations is not None:\n"
        "    import arbiter.integrations as pkg\n"
        "    for info in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(f'arbiter.integrations.{info.name}')\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_source_never_imports_the_top_level_folders() -> None:
    # `import services...` would load a second copy of every module under another name.
    offenders = []
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    for name in tracked:
        path = REPO / name
        for line in path.read_text().splitlines():
            stripped = line.strip()
            for top in ("services", "trainer", "proto"):
                if stripped.startswith((f"from {top}.", f"import {top}.", f"from {top} ")):
                    offenders.append(f"{path.relative_to(REPO)}: {stripped}")
    assert offenders == []
