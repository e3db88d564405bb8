"""The committed OpenAPI specs in proto/openapi/ match the code (run `make openapi` to update)."""

from __future__ import annotations

import pytest

from arbiter.openapi import OPENAPI_DIR, SERVICES, available, render


@pytest.mark.parametrize("service", SERVICES)
def test_committed_spec_matches_code(service: str) -> None:
    assert service in available(), f"services/{service} is missing"
    path = OPENAPI_DIR / f"{service}.json"
    assert path.exists(), f"{path} missing: run `make openapi`"
    assert path.read_text() == render(service), f"{path} is stale: run `make openapi`"


def test_no_spec_without_a_service() -> None:
    committed = {p.stem for p in OPENAPI_DIR.glob("*.json")}
    assert committed <= set(SERVICES)


@pytest.mark.parametrize("service", SERVICES)
def test_every_error_response_is_the_envelope(service: str) -> None:
    import json

    spec = json.loads(render(service))
    for path, ops in spec["paths"].items():
        if path == "/readyz":  # a not-ready answer is a Readiness body, by design
            continue
        for method, op in ops.items():
            for status, resp in op.get("responses", {}).items():
                if status.startswith(("4", "5")):
                    schema = resp["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (
                        f"{service} {method.upper()} {path} {status}"
                    )
