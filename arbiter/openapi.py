"""Export each service's OpenAPI JSON into ``proto/openapi/`` (and check it for drift)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

SERVICES = ("gateway", "verify", "embedding", "judge")
OPENAPI_DIR = Path(__file__).resolve().parents[1] / "proto" / "openapi"


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
