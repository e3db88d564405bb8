"""Settings fail fast with a fix in the message; a model that cannot load is reported."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from arbiter.services.embedding.settings import (
    CPU_TOKEN_BUDGET,
    GPU_TOKEN_BUDGET,
    EmbeddingSettings,
)
from tests.conftest import start_service

BAD_SETTINGS = [
    # float16 kernels are missing or slow on CPU
    ({"device": "cpu", "dtype": "float16"}, "use float32 or bfloat16 on CPU"),
    # a path that is not there (a typo) is caught before any loading
    ({"model": "/nonexistent/model-dir"}, "is not a directory"),
    # unknown device names
    ({"device": "gpu"}, "device"),
    # dtype outside the three supported
    ({"dtype": "int8"}, "dtype"),
    # zero-sized batches
    ({"batch_size": 0}, "batch_size"),
]


@pytest.mark.parametrize(("kwargs", "needle"), BAD_SETTINGS)
def test_bad_settings_fail_fast(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        EmbeddingSettings(**kwargs)  # type: ignore[arg-type]


def test_defaults() -> None:
    s = EmbeddingSettings()
    assert s.port == 8002 and s.device == "auto" and s.dtype == "float32"
    assert s.model_name == "all-MiniLM-L6-v2"
    assert Path(s.model).is_dir()


def test_model_that_cannot_load_is_reported_not_hung(log_dir: Path) -> None:
    # offline, a hub id that is not in the cache cannot load: a real failure, not a mock
    env = {"EMBEDDING_MODEL": "arbiter-tests/no-such-model", "HF_HUB_OFFLINE": "1"}
    proc, url = start_service("embedding", log_dir, env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready = httpx.get(f"{url}/readyz")
            if "failed to load" in ready.text:
                break
            time.sleep(0.2)
        assert ready.status_code == 503 and "failed to load" in ready.json()["checks"]["model"]
        r = httpx.post(f"{url}/v1/diversity", json={"groups": [{"responses": ["a", "b"]}],
                                                    "params": {}})  # fmt: skip
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "unavailable"
        assert r.json()["error"]["code"] == "model_unavailable"
    finally:
        proc.stop()


def test_batch_token_budget_by_device_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # unset: a CPU batch is bounded in time (4,096 tokens), a GPU's by 512 texts of 256
    s = EmbeddingSettings()
    assert s.token_budget("cpu") == CPU_TOKEN_BUDGET == 4096
    assert s.token_budget("cuda") == s.token_budget("cuda:1") == GPU_TOKEN_BUDGET
    monkeypatch.setenv("EMBEDDING_BATCH_TOKEN_BUDGET", "1000")
    assert EmbeddingSettings().token_budget("cuda") == 1000
    monkeypatch.setenv("EMBEDDING_BATCH_TOKEN_BUDGET", "0")  # off: texts only
    assert EmbeddingSettings().token_budget("cpu") == 0
    monkeypatch.setenv("EMBEDDING_BATCH_TOKEN_BUDGET", "-1")
    with pytest.raises(ValidationError, match="batch_token_budget"):
        EmbeddingSettings()
