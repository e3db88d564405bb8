"""The variables docker-compose.yml requires (``${VAR:?…}``), set as a user sets them, so
``docker-compose config`` renders the file."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def required_compose_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_KEY_SECRET", "0123456789abcdef" * 4)
