"""The envs service's scoring settings: its own (``ENVS_*``), never the gateway's."""

from __future__ import annotations

import pytest

from arbiter.services.envs.rewards import component_settings
from arbiter.services.envs.settings import EnvsSettings
from arbiter.services.scoring.settings import ComponentSettings


def test_component_settings_come_from_envs_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host that also runs a gateway: its GATEWAY_* variables must not change how the envs
    # service scores (the scoring core reads no environment of its own).
    monkeypatch.setenv("GATEWAY_MAX_CONCURRENCY", "3")
    monkeypatch.setenv("GATEWAY_JUDGE_URL", "http://judge:8003")
    envs = EnvsSettings(
        state_redis_url="redis://127.0.0.1:6380/0",
        verify_url="http://verify:8001/",
        sandbox_url=None,
        component_timeout_s=7.0,
    )
    c = component_settings(envs)
    assert c.service_urls == {"verify": "http://verify:8001"}  # no sandbox: not configured
    assert c.timeout_for("code_tests") == 7.0
    assert c.max_concurrency == ComponentSettings().max_concurrency
