"""What `pip install arbiter-rewards` puts into a user's environment.

The repository keeps services/, trainer/ and proto/ at its top level; installed, they
must live under the one import name ``arbiter`` (setuptools' package_dir mapping, setup.py)
so that a user's own ``trainer.py`` or ``services`` package cannot shadow ours (or be
shadowed by ours). The client and the framework adapters must import with the base
dependencies only. The wheel is installed into a fresh venv and run from outside the
checkout: every service starts from it, and the trainer's command answers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from arbiter.procs import ManagedProcess, free_port
from arbiter.serve import SERVICES
from tests.conftest import start_redis

REPO = Path(__file__).resolve().parents[1]
MAPPED = ("services", "trainer", "proto")  # top-level folders installed as arbiter.<name>

# Imported by the service and trainer extras only; the client must not need them.
EXTRAS_ONLY = ["fastapi", "uvicorn", "starlette", "redis", "torch", "transformers",
               "sentence_transformers", "math_verify", "prometheus_client", "aiohttp",
               "numpy"]  # fmt: skip


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-s", "--", *paths], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return out.splitlines()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # setuptools stages the build in the checkout's build/ (git-ignored) and does not empty it:
    # a module deleted since the last build would still be packaged
    shutil.rmtree(REPO / "build", ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (whl,) = out.glob("arbiter_rewards-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and nothing else of ours. A .pth line lends it this
    venv's third-party packages (fastapi, torch, ...); a .pth file is read only in a site
    folder, so the checkout's editable install, whose hook sits in this venv's site-packages,
    stays off."""
    root = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install",
         "-q", "--no-deps", "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (site,) = (root / "lib").glob("python3*/site-packages")
    lent = [p for p in sys.path if p.endswith("site-packages")]  # this venv's, and any it reads
    (site / "third_party.pth").write_text("\n".join(lent) + "\n")
    return root


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory outside the checkout: nothing of ours on sys.path but the venv."""
    return tmp_path


def _python(venv: Path, code: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARBITER_GSM8K_DIR"}  # the defaults
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_no_tracked_symbolic_links() -> None:
    # Mode 120000 is a symbolic link: the folders are real, and mapped by setup.py.
    links = [line for line in _tracked() if line.startswith("120000 ")]
    assert links == []


def test_wheel_has_one_top_level_import_name(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"arbiter"}
    # Every tracked module of the mapped folders is in the wheel under arbiter/ (a subpackage
    # added later, services/<new>/, is found by setup.py without a change there).
    expected = {f"arbiter/{line.split(chr(9))[1]}" for line in _tracked(*MAPPED)
                if line.endswith(".py")}  # fmt: skip
    expected |= {line.split("\t")[1] for line in _tracked("arbiter") if line.endswith(".py")}
    assert expected - names == set()
    assert "arbiter/proto/openapi/gateway.json" in names  # package data


def test_installed_wheel_runs_from_outside_the_checkout(venv: Path, elsewhere: Path) -> None:
    code = (
        "import importlib, json\n"
        "from importlib import resources\n"
        "import arbiter.gsm8k, arbiter.openapi\n"
        f"mods = [importlib.import_module(f'arbiter.services.{{n}}.app') for n in {SERVICES!r}]\n"
        "mods += [importlib.import_module(m) for m in ('arbiter.trainer.config', 'arbiter.proto')"
        "]\n"
        "print(json.dumps({'files': [m.__file__ for m in mods],\n"
        "  'openapi': str(arbiter.openapi.OPENAPI_DIR),\n"
        "  'spec': (resources.files('arbiter.proto') / 'openapi' / 'verify.json').is_file(),\n"
        "  'checkout': str(arbiter.gsm8k.checkout())}))\n"
    )
    found = json.loads(_python(venv, code, elsewhere))
    assert all(f.startswith(str(venv)) for f in found["files"]), found["files"]
    assert found["openapi"].startswith(str(venv))  # package data, not the checkout's proto/
    assert found["spec"] is True
    assert found["checkout"] == "None"  # so the GSM8K default does not look beside a checkout
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "arbiter.trainer", "--help"],
                         cwd=elsewhere, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m arbiter.trainer")


def test_installed_wheel_names_the_gsm8k_variable_when_data_is_missing(
    venv: Path, elsewhere: Path
) -> None:
    code = "from arbiter import gsm8k\ntry:\n    gsm8k.require()\nexcept FileNotFoundError as e:\n    print(e)\n"  # noqa: E501
    message = _python(venv, code, elsewhere)
    # no checkout to look beside: ../shared/data/gsm8k from the working directory, not there
    assert "ARBITER_GSM8K_DIR" in message and "installed from a wheel" in message, message


@pytest.fixture
def served(venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Every service started with the venv's own `arbiter serve`, outside the checkout (its
    worker processes start with the working directory on sys.path), ready or answering."""
    monkeypatch.chdir(tmp_path)
    redis, redis_url = start_redis(tmp_path)
    procs: list[ManagedProcess] = [redis]
    urls: dict[str, str] = {}
    env = {"verify": {"VERIFY_WORKERS": "1"}, "embedding": {"EMBEDDING_DEVICE": "cpu"},
           "envs": {"ENVS_STATE_REDIS_URL": redis_url},
           "gateway": {"REDIS_URL": redis_url}}  # fmt: skip
    try:
        for name in SERVICES:  # in start order: the gateway last
            if name == "gateway":
                env[name]["GATEWAY_VERIFY_URL"] = urls["verify"]
            port = free_port()
            proc = ManagedProcess(
                name=name, argv=[str(venv / "bin" / "arbiter"), "serve", name, "--port", str(port)],
                env=env.get(name, {}), ready_url=f"http://127.0.0.1:{port}/healthz",
                log_path=tmp_path / f"{name}.log", port=port,
            )  # fmt: skip
            procs.append(proc.start())
            proc.wait_ready(120.0)
            urls[name] = f"http://127.0.0.1:{port}"
        yield urls
    finally:
        for proc in reversed(procs):
            proc.stop()


def _ready(url: str, timeout: float = 120.0) -> httpx.Response:
    """/readyz once it answers 200 (the embedder loads its model), or its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{url}/readyz", timeout=10)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.5)


def test_installed_wheel_serves_every_service(served: dict[str, str]) -> None:
    assert list(served) == list(SERVICES)
    for name, url in served.items():
        # Ready: the services with all they need here. The judge has no judge model server
        # here (and the sandbox may lack bubblewrap), so they answer 503 naming the check.
        r = _ready(url, 120.0 if name in ("verify", "embedding", "gateway") else 0.0)
        if name in ("verify", "embedding", "gateway"):
            assert r.status_code == 200, (name, r.text)
        assert r.status_code in (200, 503) and set(r.json()) >= {"ready", "checks"}, r.text
    answers = ["<think>1+1</think><answer>2</answer>", "<answer>3</answer>"]
    group = {"id": "g", "prompt": "1+1?", "reference": "2", "responses": answers}
    recipe = {"components": [{"name": "math_accuracy", "weight": 1.0}]}
    r = httpx.post(f"{served['gateway']}/v1/score", json={"recipe": recipe, "groups": [group]},
                   timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["groups"][0]["components"]["math_accuracy"] == [1.0, 0.0]


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


def test_editable_install_serves_the_mapped_folders_from_the_repository_root() -> None:
    # From the root, ./arbiter (the client, the CLI) is found first on sys.path as a regular
    # package without services/ inside: setuptools' editable finder must still map
    # arbiter.services, .trainer and .proto onto the top-level folders.
    code = (
        "import arbiter, arbiter.services.gateway.app as g, arbiter.trainer.config as t, "
        "arbiter.proto.gateway as p\n"
        "print(arbiter.__file__, g.__file__, t.__file__, p.__file__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    root, gateway, trainer, proto = (Path(p) for p in out.stdout.split())
    assert root == REPO / "arbiter" / "__init__.py"
    assert gateway == REPO / "services" / "gateway" / "app.py"
    assert trainer == REPO / "trainer" / "config.py"
    assert proto == REPO / "proto" / "gateway.py"


def test_source_never_imports_the_top_level_folders() -> None:
    # From the repository root `import services.gateway` works (the folder is on sys.path)
    # and loads a second copy of every module under another name; installed, it fails.
    offenders = []
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    for name in tracked:
        path = REPO / name
        for line in path.read_text().splitlines():
            stripped = line.strip()
            for top in MAPPED:
                if stripped.startswith((f"from {top}.", f"import {top}.", f"from {top} ")):
                    offenders.append(f"{path.relative_to(REPO)}: {stripped}")
    assert offenders == []
