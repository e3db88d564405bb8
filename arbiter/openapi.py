"""Export each service's OpenAPI JSON into ``proto/openapi/`` (and check it for drift)."""

from __future__ import annotations

import importlib
import json
from importlib import resources
from pathlib import Path

SERVICES = ("gateway", "verify", "embedding", "judge", "sandbox")


def spec_dir() -> Path:
    """``proto/openapi/``, found by importlib.resources wherever ``arbiter.proto`` is installed:
    the checkout's top-level ``proto/`` in an editable install, site-packages from a wheel."""
    folder = resources.files("arbiter.proto") / "openapi"
    if not isinstance(folder, Path):  # e.g. a zip import: no folder on disk to write to
        raise RuntimeError(f"arbiter.proto's OpenAPI specs are not files on disk ({folder})")
    return folder


OPENAPI_DIR = spec_dir()


def render(service: str) -> str:
    """The service's OpenAPI document as canonical JSON text (built without starting it)."""
    module = importlib.import_module(f"arbiter.services.{service}.app")
    app = module.create_app()
    return json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"


def available() -> list[str]:
    found = []
    for name in SERVICES:
        try:
            importlib.import_module(f"arbiter.services.{name}.app")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith(f"arbiter.services.{name}"):
                continue
            raise
        found.append(name)
    return found


def export(out_dir: Path = OPENAPI_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in available():
        path = out_dir / f"{name}.json"
        path.write_text(render(name))
        written.append(path)
    return written
