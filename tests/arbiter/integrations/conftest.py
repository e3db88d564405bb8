"""A gateway with every offline component (verify + embedding) for the adapters' tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import start_service


@pytest.fixture(scope="session")
def diverse_gateway_url(log_dir: Path, verify_url: str, redis_url: str) -> Iterator[str]:
    """Gateway → verify + embedding (all-MiniLM-L6-v2 on CPU): recipe gsm8k-diverse works."""
    embedding, embedding_url = start_service("embedding", log_dir, {"EMBEDDING_DEVICE": "cpu"})
    gateway = None
    try:
        deadline = time.monotonic() + 180
        while httpx.get(f"{embedding_url}/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "embedding not ready in 180 s"
            time.sleep(0.2)
        env = {"GATEWAY_VERIFY_URL": verify_url, "GATEWAY_EMBEDDING_URL": embedding_url,
               "REDIS_URL": redis_url}  # fmt: skip
        gateway, url = start_service("gateway", log_dir, env)
        yield url
    finally:
        if gateway is not None:
            gateway.stop()
        embedding.stop()


def score_requests(gateway_url: str) -> float:
    """POST /v1/score requests the gateway has answered (its Prometheus counter)."""
    text = httpx.get(f"{gateway_url}/metrics", timeout=5).text
    prefix = "arbiter_gateway_score_requests_total{"
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))  # fmt: skip
